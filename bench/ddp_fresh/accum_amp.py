"""A fresh DDP user script for reviewing dagprof: gradient accumulation under bf16 autocast.

Habits it exercises, as users write them:
- ``no_sync()`` on all but the last of ``--accum`` micro-batches (one all-reduce per optimizer step);
- ``torch.autocast('cpu', dtype=torch.bfloat16)`` around forward and loss;
- ``OneCycleLR`` stepped once per optimizer step;
- a ``DataLoader`` with ``num_workers=2`` and a ``DistributedSampler`` (``set_epoch`` each epoch);
- a checkpoint saved by rank 0 every ``--save-every`` optimizer steps (``torch.save`` of model and optimizer state).

    dagprof profile -o runs/accum -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/accum_amp.py --steps 20
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Tabular(nn.Module):
    """A residual MLP over tabular features, as a user's regression model."""

    def __init__(self, features: int = 96, width: int = 384, depth: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps")
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--save-every", type=int, default=6)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    n = args.batch * args.accum * args.steps * dist.get_world_size()
    data = TensorDataset(torch.randn(n, 96), torch.randint(0, 10, (n,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=2, persistent_workers=True)
    model = DDP(Tabular())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=args.steps)
    ckpt_dir = tempfile.mkdtemp(prefix="accum_ckpt_")
    step = 0
    epoch = 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % args.accum == 0
            ctx = model.no_sync() if not last else torch.enable_grad()
            with ctx:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x), y) / args.accum
                loss.backward()
            if not last:
                continue
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if rank == 0 and step % args.save_every == 0:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step},
                           os.path.join(ckpt_dir, "last.pt"))
            if step == args.steps:
                break
        epoch += 1
    if rank == 0:
        print(f"accum_amp: {step} steps, loss {loss.item() * args.accum:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
