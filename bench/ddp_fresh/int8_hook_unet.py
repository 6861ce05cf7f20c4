"""A fresh DDP user script for reviewing dagprof: a U-Net denoiser whose gradients go on the wire as int8, by a comm hook
the user wrote.

Habits it exercises, as users write them:
- ``register_comm_hook(state, int8_hook)``: per bucket, the gradients' largest magnitude is agreed on with a blocking
  ``all_reduce(MAX)`` of one float, the bucket is rounded to int8 levels that cannot overflow when the ranks' sum
  (127 // world of them a side), all-reduced with ``async_op=True``, and turned back into the average in the future's
  callback: a quarter of DDP's bytes on the wire;
- a small U-Net (two down and two up stages with skip connections, GroupNorm) denoising 32x32 images, AdamW, cosine LR,
  ``bucket_cap_mb=2``.

Without a profiler it prints its median step from step 5 on (``zero1_measure.py --script`` reads it).

    dagprof profile -o runs/int8 -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/int8_hook_unet.py --steps 12
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def int8_hook(group: dist.ProcessGroup, bucket):  # DDP refuses a "bucket" annotation other than its own GradBucket class
    grad = bucket.buffer()
    world = group.size()
    scale = grad.abs().max().reshape(1)
    dist.all_reduce(scale, op=dist.ReduceOp.MAX, group=group)  # every rank rounds on the same grid
    levels = 127 // world
    step = scale.clamp_min(1e-12) / levels
    q = torch.round(grad / step).clamp_(-levels, levels).to(torch.int8)
    fut = dist.all_reduce(q, group=group, async_op=True).get_future()

    def back(f: torch.futures.Future) -> torch.Tensor:
        grad.copy_(f.value()[0].to(grad.dtype) * (step / world))
        return grad

    return fut.then(back)


class Block(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
                                  nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class UNet(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        w = width
        self.down1, self.down2, self.mid = Block(3, w), Block(w, 2 * w), Block(2 * w, 4 * w)
        self.up2, self.up1 = Block(4 * w + 2 * w, 2 * w), Block(2 * w + w, w)
        self.out = nn.Conv2d(w, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.down1(x)
        b = self.down2(F.max_pool2d(a, 2))
        m = self.mid(F.max_pool2d(b, 2))
        u = self.up2(torch.cat([F.interpolate(m, scale_factor=2), b], 1))
        u = self.up1(torch.cat([F.interpolate(u, scale_factor=2), a], 1))
        return self.out(u)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--width", type=int, default=64, help="the first stage's channels (64: 2.3 M parameters, 9 MB of fp32 gradients)")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(UNet(args.width), bucket_cap_mb=2)
    model.register_comm_hook(dist.group.WORLD, int8_hook)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps)
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        clean = torch.rand(args.batch, 3, args.size, args.size, generator=gen)
        noisy = clean + 0.2 * torch.randn(clean.shape, generator=gen)
        loss = F.mse_loss(model(noisy), clean)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[5:])
        print(f"int8_hook_unet: {args.steps} steps, loss {loss.item():.4f}, median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
