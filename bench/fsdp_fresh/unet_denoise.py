"""A fresh user script for judging dagprof's DDP -> FSDP conversion on a family none of the kept pairs has: a small
diffusion denoiser (a U-Net conditioned on the noise level), as a user writes one.

Habits it exercises (not the mixer, ResNet, LoRA, recommender, transformer LM, GRU, depthwise convnet, Conformer, VAE,
translator or TCN the conversion was judged on):
- a sinusoidal noise-level embedding through an MLP, added inside each residual block; ``--depth`` down blocks in
  ``model.down`` (each a residual conv block then a strided conv) and as many up blocks in ``model.up`` (nearest
  upsampling, a skip concatenated from the matching down block): two numbered containers;
- ``--wrap fsdp``: ``fully_shard`` on every down and up block, then the root; ``--wrap ddp``: ``DistributedDataParallel``;
- the DDPM noise-prediction loss at a random noise level per sample, ``AdamW`` with a cosine schedule, and an
  exponential moving average of the weights updated after every step (``torch.no_grad``, ``lerp_`` on each parameter:
  on FSDP2 on the local shards).

    dagprof profile -o runs/unet-ddp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/unet_denoise.py --wrap ddp
    dagprof whatif runs/unet-ddp --data-parallel fsdp     # against: the same with --wrap fsdp
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def level_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    freqs = torch.exp(-math.log(1e4) * torch.arange(dim // 2) / (dim // 2))
    a = t[:, None] * freqs[None]
    return torch.cat([a.sin(), a.cos()], dim=1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, emb: int) -> None:
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.e = nn.Linear(emb, cout)
        self.n2, self.c2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        h = self.c1(F.silu(self.n1(x))) + self.e(e)[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class Down(nn.Module):
    def __init__(self, cin: int, cout: int, emb: int) -> None:
        super().__init__()
        self.res, self.pool = ResBlock(cin, cout, emb), nn.Conv2d(cout, cout, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.res(x, e)
        return self.pool(h), h


class Up(nn.Module):
    def __init__(self, cin: int, cskip: int, cout: int, emb: int) -> None:
        super().__init__()
        self.res = ResBlock(cin + cskip, cout, emb)

    def forward(self, x: torch.Tensor, skip: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return self.res(torch.cat([F.interpolate(x, scale_factor=2.0, mode="nearest"), skip], dim=1), e)


class UNet(nn.Module):
    def __init__(self, width: int, depth: int, emb: int) -> None:
        super().__init__()
        chans = [width * 2**k for k in range(depth + 1)]
        self.emb_dim = emb
        self.embed = nn.Sequential(nn.Linear(emb, emb), nn.SiLU(), nn.Linear(emb, emb))
        self.stem = nn.Conv2d(3, chans[0], 3, padding=1)
        self.down = nn.ModuleList(Down(chans[k], chans[k + 1], emb) for k in range(depth))
        self.mid = ResBlock(chans[-1], chans[-1], emb)
        self.up = nn.ModuleList(Up(chans[k + 1], chans[k + 1], chans[k], emb) for k in reversed(range(depth)))
        self.out = nn.Conv2d(chans[0], 3, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        e = self.embed(level_embedding(t, self.emb_dim))
        h, skips = self.stem(x), []
        for blk in self.down:
            h, s = blk(h, e)
            skips.append(s)
        h = self.mid(h, e)
        for blk in self.up:
            h = blk(h, skips.pop(), e)
        return self.out(h)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--emb", type=int, default=64)
    p.add_argument("--batch", type=int, default=12)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = UNet(args.width, args.depth, args.emb)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in [*model.down, *model.up]:
            fully_shard(blk)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    with torch.no_grad():
        ema = [q.detach().clone() for q in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    alphas = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000), dim=0)
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        x0 = torch.rand(args.batch, 3, args.size, args.size, generator=gen) * 2 - 1
        t = torch.randint(0, 1000, (args.batch,), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        a = alphas[t][:, None, None, None]
        loss = F.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t.float()), noise)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        with torch.no_grad():
            for e, q in zip(ema, model.parameters()):
                e.lerp_(q.detach(), 0.001)
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
