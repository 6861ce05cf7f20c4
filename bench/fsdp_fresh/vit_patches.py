"""A fresh FSDP2 user script for reviewing dagprof (issue 16): a small vision transformer on random images.

Habits it exercises, as users write them (none of the other fresh scripts has them together):
- a ``Conv2d`` patch embedding, a class token and learned position embeddings (``nn.Parameter``s of the root);
- attention written by hand (``q @ k.transpose``, softmax, dropout), pre-norm blocks, ``nn.GELU`` MLPs;
- ``fully_shard`` on each block with the default reshard, the root last;
- ``SGD(momentum=0.9, nesterov=True)``, ``CrossEntropyLoss(label_smoothing=0.1)``, a ``train_step`` function that returns
  ``loss.item()`` (the graph goes with the step).

    dagprof profile -o runs/vit -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/vit_patches.py --steps 10
    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/vit_patches.py --memory /tmp/vit-mem   # each step's peak per rank
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

IMAGE, PATCH, DIM, HEADS, CLASSES, BATCH = 32, 4, 96, 4, 10, 8


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = self.drop((q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5).softmax(dim=-1))
        return self.proj((att @ v).transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(d), Attention(d, HEADS)
        self.norm2, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        n = (IMAGE // PATCH) ** 2
        self.patch = nn.Conv2d(3, DIM, PATCH, stride=PATCH)
        self.cls = nn.Parameter(torch.zeros(1, 1, DIM))
        self.pos = nn.Parameter(torch.randn(1, n + 1, DIM) * 0.02)
        self.blocks = nn.ModuleList(Block(DIM) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, CLASSES)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.patch(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def train_step(model: nn.Module, opt: torch.optim.Optimizer, crit: nn.Module, g: torch.Generator) -> float:
    img, label = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)
    loss = crit(model(img), label)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = ViT(args.depth)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    crit = nn.CrossEntropyLoss(label_smoothing=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    for step in range(args.steps):
        with peaks.step():
            loss = train_step(model, opt, crit, g)
        if dist.get_rank() == 0 and step % 3 == 0:
            print(f"step {step} loss {loss:.3f}", flush=True)
    peaks.save(dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
