"""A fresh user-style job under the composable ``replicate()`` (issue 16): a RealNVP normalizing flow on tabular data.

Habits, as users write them (no other fresh script has this family or these habits together):
- RealNVP (Dinh et al. 2017): affine coupling layers with alternating masks, each scale and shift from an MLP (tanh-bounded
  scale), the exact log-likelihood under a standard normal base, trained by maximum likelihood;
- a frozen whitening layer fitted on rank 0's first batch and broadcast (``dist.broadcast`` before training), kept out of
  data parallelism by ``replicate(model, ignored_modules=[model.whiten], bucket_cap_mb=1)``;
- ``torch.optim.AdamW``, ``clip_grad_norm_`` every step, a ``OneCycleLR`` schedule; data drawn on each rank from a
  correlated Gaussian mixture (a DataLoader-free loop).

    dagprof profile -o runs/realnvp -- torchrun --standalone --nproc-per-node 2 bench/replicate_fresh/realnvp_tabular.py --steps 12
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._composable import replicate
from torch.nn.parallel import DistributedDataParallel as DDP


class Coupling(nn.Module):
    def __init__(self, dim: int, hidden: int, mask: torch.Tensor):
        super().__init__()
        self.register_buffer("mask", mask)
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 2 * dim))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s, t = self.net(x * self.mask).chunk(2, dim=1)
        s = torch.tanh(s) * (1 - self.mask)
        y = x * self.mask + (1 - self.mask) * (x * torch.exp(s) + t)
        return y, s.sum(1)


class RealNVP(nn.Module):
    def __init__(self, dim: int = 24, hidden: int = 384, layers: int = 8):
        super().__init__()
        self.whiten = nn.Linear(dim, dim)
        self.whiten.requires_grad_(False)
        masks = [(torch.arange(dim) % 2 == k % 2).float() for k in range(layers)]
        self.couplings = nn.ModuleList(Coupling(dim, hidden, m) for m in masks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.whiten(x)
        logdet = torch.zeros(x.shape[0])
        for c in self.couplings:
            z, ld = c(z)
            logdet = logdet + ld
        logp = -0.5 * (z * z).sum(1) - 0.5 * z.shape[1] * math.log(2 * math.pi)
        return -(logp + logdet).mean()


def draw(n: int, dim: int, gen: torch.Generator, mix: torch.Tensor) -> torch.Tensor:
    k = torch.randint(0, mix.shape[0], (n,), generator=gen)
    return mix[k] + torch.randn(n, dim, generator=gen) @ torch.tril(torch.ones(dim, dim)) / dim ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--ddp", action="store_true", help="the same job under DistributedDataParallel (the bench's control)")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = RealNVP()
    dim = model.whiten.in_features
    mix = 3 * torch.randn(5, dim, generator=torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(99 + rank)
    with torch.no_grad():  # whitening from rank 0's first batch, the same on every rank
        x0 = draw(4096, dim, gen, mix)
        cov = torch.cov(x0.T) + 1e-3 * torch.eye(dim)
        w = torch.linalg.cholesky(torch.linalg.inv(cov)).T.contiguous()
        model.whiten.weight.copy_(w)
        model.whiten.bias.copy_(-(w @ x0.mean(0)))
        dist.broadcast(model.whiten.weight, 0)
        dist.broadcast(model.whiten.bias, 0)
    net = model
    if a.ddp:  # its frozen whitening takes no gradient, so DDP leaves it out as replicate()'s ignored_modules does
        model = DDP(net, bucket_cap_mb=1)
    else:
        replicate(model, ignored_modules=[model.whiten], bucket_cap_mb=1)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=a.steps)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = model(draw(a.batch, dim, gen, mix))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"realnvp: nll {loss.item():.3f}, median step {statistics.median(times[3:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
