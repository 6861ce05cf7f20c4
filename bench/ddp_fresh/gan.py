"""A fresh DDP user script for reviewing dagprof: a small GAN, two DDP models, two optimizers, two backwards per step.

Habits it exercises, as users write them:
- generator and discriminator each wrapped in its own DDP (two reducers, two sets of buckets);
- per iteration: the discriminator's step (real and detached fake in one batch, ``optD.step()``), then the
  generator's (its loss through the discriminator, whose gradients DDP all-reduces too and ``optD`` discards),
  ``optG.step()``; Adam with betas (0.5, 0.999) for both.

    dagprof profile -o runs/gan -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/gan.py --steps 20
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def generator(z: int = 64) -> nn.Module:
    return nn.Sequential(
        nn.Linear(z, 128 * 7 * 7), nn.Unflatten(1, (128, 7, 7)), nn.BatchNorm2d(128), nn.ReLU(),
        nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.ConvTranspose2d(64, 1, 4, 2, 1), nn.Tanh(),
    )


def discriminator() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 64, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Conv2d(64, 128, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Flatten(), nn.Linear(128 * 7 * 7, 1),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    G, D = DDP(generator()), DDP(discriminator())
    optG = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optD = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    ones, zeros = torch.ones(args.batch, 1), torch.zeros(args.batch, 1)
    for _ in range(args.steps):
        real = torch.rand(args.batch, 1, 28, 28) * 2 - 1
        fake = G(torch.randn(args.batch, 64))
        logits = D(torch.cat([real, fake.detach()]))
        lossD = F.binary_cross_entropy_with_logits(logits, torch.cat([ones, zeros]))
        optD.zero_grad()
        lossD.backward()
        optD.step()
        lossG = F.binary_cross_entropy_with_logits(D(fake), ones)
        optG.zero_grad()
        lossG.backward()
        optG.step()
    if dist.get_rank() == 0:
        print(f"gan: {args.steps} steps, lossD {lossD.item():.3f} lossG {lossG.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
