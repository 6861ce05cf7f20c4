"""A fresh DDP user script for reviewing dagprof: torch's PowerSGD comm hook registered by the user.

Habits it exercises, as users write them:
- a small conv classifier (one DDP bucket), SGD with momentum;
- ``powerSGD_hook`` with ``PowerSGDState`` (rank 2, error feedback, warm start, compression from step 2), whose P and Q
  all-reduces run from callbacks chained on the hook's futures (on gloo's thread, or at once where the future is done).

    dagprof profile -o runs/psgd -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/powersgd_user.py --steps 8
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 16, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = DDP(model)  # one bucket: PowerSGD on gloo with several in flight can pair the wrong messages, or hang
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2, min_compression_rate=2,
                               use_error_feedback=True, warm_start=True)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(args.steps):
        x, y = torch.randn(args.batch, 3, 16, 16, generator=g), torch.randint(0, 10, (args.batch,), generator=g)
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
