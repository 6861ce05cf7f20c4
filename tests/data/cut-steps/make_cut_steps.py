"""Record the traces in this folder: a 2-rank gloo DDP MLP on CPU under ``torch.profiler`` with a schedule whose active
window outlasts the loop's 6 steps, so ``stop()`` (leaving the ``with`` block) closes the last ProfilerStep wherever
the loop was, as a user's loop that ends or breaks inside the window does.

    python tests/data/cut-steps/make_cut_steps.py {break,stub,stepfirst} OUTDIR   # then gzip OUTDIR/rank0.json

``break``: the loop leaves after step 4's backward (cut between ops); ``stub``: ``prof.step()`` after each step, so the
last one opens a step that ``stop()`` closes empty; ``stepfirst``: ``prof.step()`` before each step (the last one whole).
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, schedule


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, stop_after_backward: bool) -> bool:
    nn.functional.cross_entropy(model(x), y).backward()
    if stop_after_backward:
        return False
    opt.step()
    opt.zero_grad()
    return True


def run(rank: int, world: int, variant: str, outdir: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    model = DistributedDataParallel(net, bucket_cap_mb=0.5)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    for _ in range(2):
        train_step(model, opt, x, y, False)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=10, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(f"{outdir}/rank{rank}.json")) as prof:
        for i in range(6):
            if variant == "stepfirst":
                prof.step()
            if not train_step(model, opt, x, y, variant == "break" and i == 4):
                break
            if variant != "stepfirst":
                prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.makedirs(sys.argv[2], exist_ok=True)
    mp.spawn(run, args=(2, sys.argv[1], sys.argv[2]), nprocs=2)
