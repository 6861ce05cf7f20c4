"""A user's own DDP job profiled the way PyTorch's profiler tutorial shows: ``torch.profiler.profile`` with a
``schedule(wait=1, warmup=1, active=3, repeat=2)`` and ``tensorboard_trace_handler``, no dagprof code, CPU only and
(the tutorial's default) without ``record_shapes``. Each rank writes two windows' traces into one folder; the
collectives in them carry no sizes, which ``dagprof whatif`` must say instead of pricing them at 0 bytes.

    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/tutorial_profiler.py --out DIR [--record-shapes]
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="the traces' folder")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--record-shapes", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(8, 32, 5, padding=2), nn.GELU(), nn.Conv1d(32, 32, 5, padding=2), nn.GELU(),
                        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 10))
    model = DDP(net, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(16, 8, 128), torch.randint(0, 10, (16,))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=args.record_shapes,
                 schedule=schedule(wait=1, warmup=1, active=3, repeat=2),
                 on_trace_ready=tensorboard_trace_handler(args.out, worker_name=f"rank{rank}")) as prof:
        for _ in range(args.steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
