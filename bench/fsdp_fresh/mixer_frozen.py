"""A fresh user script for reviewing dagprof's DDP -> FSDP conversion: an MLP-Mixer fine-tuned with a frozen stem.

Habits it exercises (not dagprof's own scripts, not the LoRA job the conversion was developed on):
- a pretrained-style patch embedding and the first ``--freeze`` mixer blocks frozen (``requires_grad_(False)``), the
  other blocks, the final norm and a new classifier head trained;
- token- and channel-mixing MLPs with ``LayerNorm``, images cut into patches by a strided ``Conv2d``;
- ``--wrap fsdp``: ``fully_shard`` on every block then the root; ``--wrap ddp``: ``DistributedDataParallel``;
- ``SGD`` with momentum over the trainable parameters, ``nn.utils.clip_grad_norm_`` on ``model.parameters()``,
  label smoothing.

    dagprof profile -o runs/mixer-ddp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/mixer_frozen.py --wrap ddp
    dagprof whatif runs/mixer-ddp --data-parallel fsdp     # against: the same with --wrap fsdp
    torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/mixer_frozen.py --wrap fsdp --memory /tmp/mixer-mem   # each step's peak per rank
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


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, image: int, patch: int, dim: int, depth: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, dim, patch, stride=patch)
        tokens = (image // patch) ** 2
        self.blocks = nn.ModuleList(MixerBlock(tokens, dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.stem(img).flatten(2).transpose(1, 2)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x).mean(dim=1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--freeze", type=int, default=2, help="mixer blocks frozen after the stem")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Mixer(32, 4, args.dim, args.depth, 10)
    model.stem.requires_grad_(False)
    for blk in model.blocks[:args.freeze]:
        blk.requires_grad_(False)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD([q for q in model.parameters() if q.requires_grad], lr=0.01, momentum=0.9)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt, ddp=args.wrap == "ddp")
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        with peaks.step():
            img, label = torch.randn(args.batch, 3, 32, 32, generator=gen), torch.randint(0, 10, (args.batch,), generator=gen)
            loss = F.cross_entropy(model(img), label, label_smoothing=0.1)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    peaks.save(dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
