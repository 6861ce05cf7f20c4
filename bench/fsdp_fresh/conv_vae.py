"""A fresh user script for judging dagprof's DDP -> FSDP conversion on a generative family none of the kept pairs has:
a convolutional variational autoencoder, as a user writes one.

Habits it exercises (not the mixer, ResNet, LoRA, recommender, transformer LM, GRU or depthwise convnet the conversion
was judged on):
- an encoder of ``--depth`` strided conv blocks (``GroupNorm``, ``SiLU``) in ``model.encoder``, a latent head of two
  linear layers (mean, log-variance) with the reparameterisation trick, and a decoder of as many transposed-conv blocks
  in ``model.decoder``: two numbered containers;
- ``--wrap fsdp``: ``fully_shard`` on every encoder and decoder block, then the root; ``--wrap ddp``:
  ``DistributedDataParallel``;
- ``Adam`` with a linear KL warm-up, the loss a reconstruction MSE plus the weighted KL term, ``clip_grad_norm_``.

    dagprof profile -o runs/vae-ddp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/conv_vae.py --wrap ddp
    dagprof whatif runs/vae-ddp --data-parallel fsdp     # against: the same with --wrap fsdp
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def down(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.GroupNorm(8, cout), nn.SiLU())


def up(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.ConvTranspose2d(cin, cout, 4, stride=2, padding=1), nn.GroupNorm(8, cout), nn.SiLU())


class VAE(nn.Module):
    def __init__(self, width: int, depth: int, size: int, latent: int) -> None:
        super().__init__()
        chans = [width * 2**k for k in range(depth + 1)]
        self.stem = nn.Conv2d(3, chans[0], 3, padding=1)
        self.encoder = nn.ModuleList(down(chans[k], chans[k + 1]) for k in range(depth))
        self.side = size // 2**depth
        flat = chans[-1] * self.side**2
        self.mu = nn.Linear(flat, latent)
        self.logvar = nn.Linear(flat, latent)
        self.expand = nn.Linear(latent, flat)
        self.decoder = nn.ModuleList(up(chans[k + 1], chans[k]) for k in reversed(range(depth)))
        self.out = nn.Conv2d(chans[0], 3, 3, padding=1)
        self.top = chans[-1]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.stem(x)
        for blk in self.encoder:
            h = blk(h)
        h = h.flatten(1)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        h = self.expand(z).view(-1, self.top, self.side, self.side)
        for blk in self.decoder:
            h = blk(h)
        return self.out(h), mu, logvar


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--latent", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = VAE(args.width, args.depth, args.size, args.latent)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in [*model.encoder, *model.decoder]:
            fully_shard(blk)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x = torch.rand(args.batch, 3, args.size, args.size, generator=gen)
        recon, mu, logvar = model(x)
        kl = -0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())
        beta = min(1.0, (step + 1) / 10)  # KL warm-up
        loss = F.mse_loss(recon, x) + beta * kl
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
