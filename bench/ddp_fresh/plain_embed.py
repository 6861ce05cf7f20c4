"""A user's DDP bag-of-words classifier (``nn.EmbeddingBag`` of 30,000 words x 64, dense gradients, two linear layers) on
gloo, Adam, profiled with plain ``torch.profiler`` (``record_shapes=True``, a ``schedule``, ``export_chrome_trace`` per rank
from ``on_trace_ready``), no dagprof code. Without ``--trace-dir`` it trains unprofiled and prints its median step from
step 5 on.

    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/plain_embed.py [--trace-dir DIR] [--steps 20]
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule


class BagClassifier(nn.Module):
    def __init__(self, vocab: int, dim: int, classes: int) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.head = nn.Sequential(nn.Linear(dim, 256), nn.ReLU(), nn.Linear(256, classes))

    def forward(self, tokens: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(tokens, offsets))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trace-dir", help="profile steps 3-5 into this folder")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(BagClassifier(30000, 64, 20))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    prof = None
    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)

        def save(p: profile) -> None:
            p.export_chrome_trace(os.path.join(args.trace_dir, f"rank{rank}.step{p.step_num}.pt.trace.json"))

        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                       schedule=schedule(wait=2, warmup=1, active=3, repeat=1), on_trace_ready=save)
        prof.start()
    g = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        lengths = torch.randint(5, 60, (128,), generator=g)
        tokens = torch.randint(0, 30000, (int(lengths.sum()),), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        labels = torch.randint(0, 20, (128,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(tokens, offsets), labels).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
    if rank == 0:
        tail = sorted(times[5:])
        print(f"plain_embed: {args.steps} steps, median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
