"""A fresh user script for judging dagprof's DDP -> FSDP conversion on a family none of the judged pairs has: a small
MobileNet-style image classifier of depthwise-separable blocks, as a user writes one.

Habits it exercises (not the mixer, ResNet, LoRA, recommender, transformer LM or GRU the conversion was judged on):
- a conv stem, ``--depth`` inverted-residual blocks (1x1 expand, 3x3 depthwise, 1x1 project, ``BatchNorm`` and
  ``Hardswish``; a residual where the shape allows; every other block strides 2), global pooling and a dropout head;
- ``--wrap fsdp``: ``fully_shard`` on every ``model.blocks[i]`` then the root; ``--wrap ddp``: ``DistributedDataParallel``;
- ``AdamW`` with weight decay, a cosine LR schedule, label smoothing, random 32x32 images.

    dagprof profile -o runs/mb-ddp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/mobile_convnet.py --wrap ddp
    dagprof whatif runs/mb-ddp --data-parallel fsdp     # against: the same with --wrap fsdp
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.Hardswish())
        self.depthwise = nn.Sequential(nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.Hardswish())
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.depthwise(self.expand(x)))
        return x + y if self.residual else y


class MobileNet(nn.Module):
    def __init__(self, width: int, depth: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.Hardswish())
        blocks, c = [], width
        for i in range(depth):
            out = c * 2 if i % 2 else c
            blocks.append(InvertedResidual(c, out, 2 if i % 2 else 1))
            c = out
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(c, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--width", type=int, default=24)
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = MobileNet(args.width, args.depth, 10)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        x = torch.randn(args.batch, 3, 32, 32, generator=gen)
        y = torch.randint(0, 10, (args.batch,), generator=gen)
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
