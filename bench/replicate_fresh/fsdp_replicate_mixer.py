"""A fresh user-style job under torch's FSDP-based ``replicate()`` (``torch.distributed._composable.replicate_with_fsdp``,
issue 16): FSDP2's machinery with every parameter replicated, each unit all-reduced after its backward.

Habits, as users write them: an MLP-Mixer over patches of synthetic 16x16 images (token- and channel-mixing MLPs with
LayerNorm), each mixer block replicated on its own and then the whole model (as FSDP2's docs wrap blocks, then the root),
``torch.optim.Adam`` with a fused-off foreach step, label smoothing, data drawn per rank each step.

    dagprof profile -o runs/mixer --no-kineto -- torchrun --standalone --nproc-per-node 2 bench/replicate_fresh/fsdp_replicate_mixer.py
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._composable.replicate_with_fsdp import replicate


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.tokens = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.channels = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, patch: int = 4, dim: int = 96, depth: int = 3, classes: int = 10):
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(3 * patch * patch, dim)
        self.blocks = nn.ModuleList(MixerBlock((16 // patch) ** 2, dim) for _ in range(depth))
        self.head = nn.Linear(dim, classes)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        p = self.patch
        x = img.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).flatten(3).flatten(1, 2)
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Mixer()
    for block in model.blocks:
        replicate(block)
    replicate(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    gen = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        x, y = torch.randn(a.batch, 3, 16, 16, generator=gen), torch.randint(0, 10, (a.batch,), generator=gen)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"mixer: loss {loss.item():.3f}, median step {statistics.median(times[2:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
