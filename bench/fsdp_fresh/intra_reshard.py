"""A fresh FSDP2 user script for reviewing dagprof (issue 16): a residual MLP tower on 4 ranks whose blocks reshard to a
smaller group after forward.

Habits it exercises, as users write them (none of the other fresh scripts has them):
- ``fully_shard(block, reshard_after_forward=2)`` with 4 ranks: after forward each block keeps a shard over 2 ranks (half
  its parameters, not a quarter), and its backward all-gather runs in that 2-rank group (torchtitan's "reshard to the
  node" habit); ``--reshard true|false|N`` changes it, to measure what a what-if predicts;
- a unit with no parameters of its own: ``fully_shard(model.tower)``, a ``Sequential`` of blocks that are all units;
- a loss module outside the sharded model (``nn.CrossEntropyLoss(label_smoothing=...)``, built once), SGD with momentum,
  ``zero_grad()`` (set to None);
- the input batch built by a ``TensorDataset`` / ``DistributedSampler`` / ``DataLoader`` with ``drop_last``.

    dagprof profile -o runs/intra -- torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/intra_reshard.py --steps 12
    torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/intra_reshard.py --memory /tmp/intra-mem   # each step's peak per rank
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))))


class Tower(nn.Module):
    def __init__(self, features: int, d: int, depth: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Linear(features, d)
        self.tower = nn.Sequential(*[Block(d) for _ in range(depth)])
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.tower(self.stem(x)))


def reshard_arg(text: str) -> bool | int:
    return {"true": True, "false": False}.get(text.lower(), None) if not text.isdigit() else int(text)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--reshard", type=reshard_arg, default=2, help="reshard_after_forward of each block: true, false or N")
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Tower(64, args.width, args.depth, 10)
    for block in model.tower:
        fully_shard(block, reshard_after_forward=args.reshard)
    fully_shard(model.tower)   # no parameters of its own: every block is a unit already
    fully_shard(model)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=32, sampler=sampler, drop_last=True)
    probe = span = None
    if args.memory:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from heap_peak import HeapPeak, tensor_bytes
        probe = HeapPeak()
        span = lambda: probe.step(tensor_bytes(model, opt, False))  # noqa: E731
    times, step = [], 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        for x, y in loader:
            t0 = time.perf_counter()
            with span() if span else contextlib.nullcontext():
                loss = criterion(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
            times.append(time.perf_counter() - t0)
            step += 1
            if step == args.steps:
                break
        if step == args.steps:
            break
    if probe is not None:
        with open(f"{args.memory}.{dist.get_rank()}", "w") as f:
            json.dump({"step_peak_bytes": probe.peaks}, f)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"reshard {args.reshard}: loss {loss.item():.3f}, median step {1e3 * tail[len(tail) // 2]:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
