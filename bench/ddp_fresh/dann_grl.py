"""A fresh DDP user script for reviewing dagprof: domain-adversarial training (DANN) of a 1-D CNN on sensor windows.

Habits it exercises, as users write them (no other fresh script has them):
- a gradient reversal layer written as a custom ``torch.autograd.Function`` (identity forward, ``-lambda * grad``
  backward), feeding a domain classifier from the shared features;
- a detached auxiliary loss: a linear probe trained on ``features.detach()`` (its gradient never reaches the encoder);
- a 1-D conv encoder (BatchNorm1d, not synchronised) on 6-channel accelerometer/gyro windows, DDP with its defaults,
  ``Adam`` with a lambda schedule for the reversal strength as in the DANN paper.

    dagprof profile -o runs/dann -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/dann_grl.py --steps 12
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CHANNELS, WINDOW, ACTIVITIES, BATCH = 6, 128, 6, 16


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, lam: float) -> torch.Tensor:
        ctx.lam = lam
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return -ctx.lam * grad, None


class DANN(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        layers, c = [], CHANNELS
        for w in (width, 2 * width, 2 * width, 4 * width):
            layers += [nn.Conv1d(c, w, 5, padding=2), nn.BatchNorm1d(w), nn.ReLU(), nn.MaxPool1d(2)]
            c = w
        self.encoder = nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.label = nn.Sequential(nn.Linear(c, 128), nn.ReLU(), nn.Linear(128, ACTIVITIES))
        self.domain = nn.Sequential(nn.Linear(c, 128), nn.ReLU(), nn.Linear(128, 2))
        self.probe = nn.Linear(c, ACTIVITIES)

    def forward(self, x: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f = self.encoder(x)
        return self.label(f), self.domain(GradReverse.apply(f, lam)), self.probe(f.detach())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--width", type=int, default=48)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(DANN(args.width))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    stamps: list[float] = []
    for step in range(args.steps):
        lam = 2 / (1 + math.exp(-10 * step / args.steps)) - 1
        src = torch.randn(BATCH, CHANNELS, WINDOW, generator=g)
        tgt = torch.randn(BATCH, CHANNELS, WINDOW, generator=g) * 1.3 + 0.2      # shifted domain, no labels
        y = torch.randint(0, ACTIVITIES, (BATCH,), generator=g)
        x = torch.cat([src, tgt])
        dom = torch.cat([torch.zeros(BATCH), torch.ones(BATCH)]).long()
        act, dom_logits, probe = model(x, lam)
        loss = (F.cross_entropy(act[:BATCH], y) + F.cross_entropy(dom_logits, dom)
                + F.cross_entropy(probe[:BATCH], y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if dist.get_rank() == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.3f} lambda {lam:.2f}", flush=True)
        stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][3:]
    if dist.get_rank() == 0 and gaps:
        print(f"median step {1000 * statistics.median(gaps):.1f} ms over {len(gaps)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
