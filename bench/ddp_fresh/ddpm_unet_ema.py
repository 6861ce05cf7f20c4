"""A fresh DDP user script for reviewing dagprof (stop 61): a class-conditional DDPM (Ho et al. 2020) on a small U-Net.

Habits it exercises, as diffusion users write them (no other fresh script has this family or these habits):
- a U-Net of ``GroupNorm`` + SiLU residual blocks, each adding a sinusoidal timestep embedding through its own
  ``Linear``, self-attention at the lowest resolution, skip connections by ``torch.cat``;
- classifier-free guidance training with the condition dropped for the WHOLE batch on a step drawn per rank
  (``--uncond-p``): on such a step the class ``nn.Embedding`` takes no part in the graph, so the model is wrapped in
  ``DistributedDataParallel(find_unused_parameters=True, gradient_as_bucket_view=True)``, and the ranks differ step to
  step in what they used;
- the noise-prediction MSE at a timestep drawn per sample, under ``torch.autocast("cpu", dtype=torch.bfloat16)``;
- EMA weights by ``torch.optim.swa_utils.AveragedModel(model.module, multi_avg_fn=get_ema_multi_avg_fn(0.999))``,
  updated after every optimizer step (outside DDP: no collective);
- AdamW with a warm-up: ``SequentialLR(LinearLR, CosineAnnealingLR)``, and ``clip_grad_norm_(1.0)``;
- ``--find-unused off`` wraps without it and never drops the condition (the run ``dagprof diff`` compares with);
  rank 0 prints its median step from the fourth on (``median step N ms``).

    dagprof profile -o runs/ddpm -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/ddpm_unet_ema.py --steps 16
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
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([args.sin(), args.cos()], dim=1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int) -> None:
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.n2, self.c2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.c1(F.silu(self.n1(x))) + self.t(temb)[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class Attention(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.norm, self.attn = nn.GroupNorm(8, ch), nn.MultiheadAttention(ch, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x).flatten(2).transpose(1, 2)
        return x + self.attn(y, y, y, need_weights=False)[0].transpose(1, 2).reshape(b, c, h, w)


class UNet(nn.Module):
    def __init__(self, ch: int = 32, classes: int = 10, tdim: int = 128) -> None:
        super().__init__()
        self.tdim = tdim
        self.temb = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.label = nn.Embedding(classes, tdim)
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.down1, self.down2 = ResBlock(ch, ch, tdim), ResBlock(ch, 2 * ch, tdim)
        self.pool = nn.AvgPool2d(2)
        self.mid, self.mid_attn = ResBlock(2 * ch, 2 * ch, tdim), Attention(2 * ch)
        self.up2, self.up1 = ResBlock(4 * ch, ch, tdim), ResBlock(2 * ch, ch, tdim)
        self.out = nn.Sequential(nn.GroupNorm(8, ch), nn.SiLU(), nn.Conv2d(ch, 3, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        temb = self.temb(timestep_embedding(t, self.tdim))
        if y is not None:
            temb = temb + self.label(y)
        h0 = self.inp(x)
        h1 = self.down1(h0, temb)
        h2 = self.down2(self.pool(h1), temb)
        m = self.mid_attn(self.mid(self.pool(h2), temb))
        u2 = self.up2(torch.cat([F.interpolate(m, scale_factor=2.0), h2], 1), temb)
        u1 = self.up1(torch.cat([F.interpolate(u2, scale_factor=2.0), h1], 1), temb)
        return self.out(u1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--uncond-p", type=float, default=0.25, help="chance a rank drops the condition for its whole batch")
    p.add_argument("--find-unused", choices=["on", "off"], default="on")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = UNet()
    model = DDP(net, find_unused_parameters=args.find_unused == "on", gradient_as_bucket_view=True)
    ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.01)
    warm = max(1, args.steps // 4)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [torch.optim.lr_scheduler.LinearLR(opt, 0.1, 1.0, warm),
                                                        torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, args.steps - warm))], [warm])
    betas = torch.linspace(1e-4, 0.02, 1000)
    alpha_bar = torch.cumprod(1 - betas, 0)
    g = torch.Generator().manual_seed(100 + rank)
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x0 = torch.tanh(torch.randn(args.batch, 3, 32, 32, generator=g).cumsum(-1) / 4)  # smooth-ish images
        label = torch.randint(0, 10, (args.batch,), generator=g)
        drop = args.find_unused == "on" and torch.rand((), generator=g).item() < args.uncond_p
        t = torch.randint(0, 1000, (args.batch,), generator=g)
        noise = torch.randn(x0.shape, generator=g)
        a = alpha_bar[t].sqrt()[:, None, None, None]
        xt = a * x0 + (1 - a * a).sqrt() * noise
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred = model(xt, t, None if drop else label)
        loss = F.mse_loss(pred.float(), noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        ema.update_parameters(net)
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e} uncond {drop}", flush=True)
        times.append(time.perf_counter() - t0)
    if rank == 0 and len(times) > 4:
        print(f"median step {statistics.median(times[3:]) * 1e3:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
