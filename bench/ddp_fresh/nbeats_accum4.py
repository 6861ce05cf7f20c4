"""A fresh DDP user script for reviewing dagprof (stop 66): N-BEATS forecasting windows of a synthetic multivariate series.

Habits it exercises, as forecasting users write them (no other fresh script has this family or these habits together):
- N-BEATS by hand: ``--stacks`` x ``--blocks`` fully connected blocks, each a 4-layer MLP giving a backcast (subtracted
  from the residual input; the last block has none, as DDP would find it unused) and a forecast (summed); generic basis
- mixed precision with the device-generic ``torch.amp.autocast("cpu", dtype=torch.bfloat16)`` around forward and loss;
- gradient accumulation of ``--accum`` (4) micro-batches: ``model.no_sync()`` on the first three, the loss divided by 4,
  ``clip_grad_norm_`` once per optimizer step; DDP with small buckets (``bucket_cap_mb=2``);
- an ``IterableDataset`` that slices sliding windows out of one long series and shards them by rank itself (no
  ``DistributedSampler``), fed through ``DataLoader(batch_size=...)``, with per-window instance normalisation;
- ``RAdam`` with ``ExponentialLR`` stepped every optimizer step; a sMAPE metric all-reduced every ``--log-every`` steps.
Without a profiler it prints its median optimizer step from step 4 on.

    dagprof profile -o runs/nbeats -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/nbeats_accum4.py
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset


class Windows(IterableDataset):
    """Sliding (lookback, horizon) windows of a seasonal random-walk series; rank r takes every world-th window."""

    def __init__(self, channels: int, length: int, lookback: int, horizon: int, rank: int, world: int) -> None:
        g = torch.Generator().manual_seed(3)
        t = torch.arange(length, dtype=torch.float32)
        season = torch.sin(2 * math.pi * t / 24)[:, None] * torch.rand(channels, generator=g) * 3
        trend = torch.cumsum(0.1 * torch.randn(length, channels, generator=g), 0)
        self.series = (season + trend + 0.3 * torch.randn(length, channels, generator=g)).T.contiguous()  # channels x length
        self.lookback, self.horizon, self.rank, self.world = lookback, horizon, rank, world

    def __iter__(self):
        g = torch.Generator().manual_seed(11 + self.rank)
        span = self.lookback + self.horizon
        while True:
            i = int(torch.randint(self.series.shape[1] - span, (1,), generator=g)) // self.world * self.world + self.rank
            c = int(torch.randint(self.series.shape[0], (1,), generator=g))
            w = self.series[c, i:i + span]
            mu, sd = w[:self.lookback].mean(), w[:self.lookback].std().clamp_min(1e-3)
            w = (w - mu) / sd
            yield w[:self.lookback], w[self.lookback:]


class Block(nn.Module):
    def __init__(self, lookback: int, horizon: int, width: int, last: bool) -> None:
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(lookback, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.backcast = None if last else nn.Linear(width, lookback)  #  would feed nothing (DDP: unused)
        self.forecast = nn.Linear(width, horizon)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        h = self.fc(x)
        return None if self.backcast is None else self.backcast(h), self.forecast(h)


class NBeats(nn.Module):
    def __init__(self, lookback: int, horizon: int, width: int, stacks: int, blocks: int) -> None:
        super().__init__()
        self.stacks = nn.ModuleList(nn.ModuleList(Block(lookback, horizon, width, s == stacks - 1 and i == blocks - 1)
                                                  for i in range(blocks)) for s in range(stacks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual, forecast = x, 0
        for stack in self.stacks:
            for block in stack:
                b, f = block(residual)
                residual = residual if b is None else residual - b
                forecast = forecast + f
        return forecast


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16, help="optimizer steps")
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="windows per micro-batch per rank")
    p.add_argument("--lookback", type=int, default=96)
    p.add_argument("--horizon", type=int, default=24)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--stacks", type=int, default=2)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--log-every", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(NBeats(args.lookback, args.horizon, args.width, args.stacks, args.blocks), bucket_cap_mb=2)
    opt = torch.optim.RAdam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.98)
    batches = iter(DataLoader(Windows(8, 20_000, args.lookback, args.horizon, rank, world), batch_size=args.batch))
    stamps: list[float] = []
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        for micro in range(args.accum):
            x, y = next(batches)
            sync = micro == args.accum - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                with torch.amp.autocast("cpu", dtype=torch.bfloat16):
                    pred = model(x)
                    loss = F.mse_loss(pred.float(), y) / args.accum
                loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % args.log_every == 0:
            smape = (2 * (pred.float() - y).abs() / (pred.float().abs() + y.abs() + 1e-6)).mean().detach()
            dist.all_reduce(smape)
            if rank == 0:
                print(f"step {step} loss {loss.item() * args.accum:.4f} sMAPE {smape.item() / world:.3f}", flush=True)
        stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][3:]
    if rank == 0 and gaps:
        print(f"median step {1000 * statistics.median(gaps):.1f} ms over {len(gaps)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
