"""A fresh user script for reviewing dagprof's DDP -> FSDP conversion, held out from its development: a small ResNet.

Habits it exercises (another family than the MLP-Mixer and the LoRA transformer the conversion was developed on):
- residual conv blocks with ``GroupNorm`` (small per-rank batches), a strided downsampling block per stage, every
  parameter trained, the blocks in one ``nn.Sequential`` (``blocks.0`` ... : what a user wraps one by one);
- ``--wrap fsdp``: ``fully_shard`` on every block then the root; ``--wrap ddp``: ``DistributedDataParallel``;
- ``AdamW`` with weight decay, no gradient clipping, ``zero_grad(set_to_none=True)``; a step's data made on the fly.

    dagprof profile -o runs/resnet-ddp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/resnet_ddp.py --wrap ddp
    dagprof whatif runs/resnet-ddp --data-parallel fsdp     # against: the same with --wrap fsdp
    torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/resnet_ddp.py --wrap fsdp --memory /tmp/resnet-mem   # each step's peak per rank
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(8, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(8, cout)
        self.skip = nn.Conv2d(cin, cout, 1, stride=stride, bias=False) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.gn1(self.conv1(x)))
        return F.relu(self.gn2(self.conv2(y)) + self.skip(x))


class ResNet(nn.Module):
    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.GroupNorm(8, width), nn.ReLU())
        w = [width, width, 2 * width, 2 * width, 4 * width]
        self.blocks = nn.Sequential(*(Block(w[i], w[i + 1], 2 if w[i + 1] != w[i] else 1) for i in range(len(w) - 1)))
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = ResNet(args.width, 10)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt, ddp=args.wrap == "ddp")
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        with peaks.step():
            img, label = torch.randn(args.batch, 3, 32, 32, generator=gen), torch.randint(0, 10, (args.batch,), generator=gen)
            F.cross_entropy(model(img), label).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    peaks.save(dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
