"""A fresh FSDP2 user script for reviewing dagprof (issue 16, prefetch depth): a small Conformer keyword spotter, 2 ranks.

The model family no other fresh script uses: a Conformer encoder (Gulati et al. 2020) over log-mel frames: a conv
subsampling front-end, then blocks of half-step macaron feed-forward, multi-head self-attention, a convolution module
(pointwise conv, GLU, depthwise conv, BatchNorm, SiLU, pointwise conv) and a second half-step feed-forward. Habits:
- explicit prefetch as torchtitan writes it: each block ``set_modules_to_forward_prefetch`` the next ``--prefetch``
  blocks and ``set_modules_to_backward_prefetch`` the ``--prefetch`` before it (``--prefetch 0``: FSDP2's implicit
  prefetch, the default);
- ``fully_shard`` per block, then the root (front-end and classifier in the root's unit), each at its default;
- SpecAugment-style time and frequency masks on the synthetic features, label-smoothed cross-entropy on the
  mean-pooled encoder output, ``AdamW`` with a linear warm-up (``LambdaLR``), ``zero_grad(set_to_none=True)``.

    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/conformer_prefetch.py --prefetch 2 --times /tmp/t.json
    dagprof profile -o runs/conf -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/conformer_prefetch.py
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


class FeedForward(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvModule(nn.Module):
    def __init__(self, d: int, kernel: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.pw1 = nn.Conv1d(d, 2 * d, 1)
        self.dw = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.pw2 = nn.Conv1d(d, d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.glu(self.pw1(self.norm(x).transpose(1, 2)), dim=1)
        return self.pw2(F.silu(self.bn(self.dw(y)))).transpose(1, 2)


class ConformerBlock(nn.Module):
    def __init__(self, d: int, heads: int, kernel: int) -> None:
        super().__init__()
        self.ff1, self.ff2 = FeedForward(d), FeedForward(d)
        self.attn_norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.conv = ConvModule(d, kernel)
        self.out_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.conv(x)
        return self.out_norm(x + 0.5 * self.ff2(x))


class KeywordSpotter(nn.Module):
    def __init__(self, mels: int, d: int, depth: int, heads: int, kernel: int, classes: int) -> None:
        super().__init__()
        self.subsample = nn.Sequential(nn.Conv2d(1, 32, 3, stride=2), nn.ReLU(), nn.Conv2d(32, 32, 3, stride=2), nn.ReLU())
        self.proj = nn.Linear(32 * (((mels - 1) // 2 - 1) // 2), d)
        self.blocks = nn.ModuleList(ConformerBlock(d, heads, kernel) for _ in range(depth))
        self.classifier = nn.Linear(d, classes)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:  # (batch, frames, mels)
        x = self.subsample(feats.unsqueeze(1))  # (batch, 32, frames/4, mels/4)
        x = self.proj(x.permute(0, 2, 1, 3).flatten(2))
        for blk in self.blocks:
            x = blk(x)
        return self.classifier(x.mean(1))


def spec_augment(feats: torch.Tensor, g: torch.Generator, time_mask: int = 12, freq_mask: int = 8) -> torch.Tensor:
    """One time and one frequency mask per utterance, zeroed."""
    b, t, f = feats.shape
    out = feats.clone()
    for i in range(b):
        t0 = int(torch.randint(0, t - time_mask, (1,), generator=g))
        f0 = int(torch.randint(0, f - freq_mask, (1,), generator=g))
        out[i, t0:t0 + time_mask] = 0
        out[i, :, f0:f0 + freq_mask] = 0
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--frames", type=int, default=96)
    p.add_argument("--mels", type=int, default=40)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--prefetch", type=int, default=0, help="blocks each block prefetches explicitly (0: FSDP2's implicit prefetch)")
    p.add_argument("--times", metavar="FILE", help="write rank 0's step times (s) as JSON")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = KeywordSpotter(args.mels, args.width, args.depth, heads=4, kernel=15, classes=35)
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    if args.prefetch > 0:
        blocks = list(model.blocks)
        for i, blk in enumerate(blocks):
            blk.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + args.prefetch])
            blk.set_modules_to_backward_prefetch(blocks[max(0, i - args.prefetch):i][::-1])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        feats = spec_augment(torch.randn(args.batch, args.frames, args.mels, generator=g), g)
        labels = torch.randint(0, 35, (args.batch,), generator=g)
        loss = F.cross_entropy(model(feats), labels, label_smoothing=0.1)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    if args.times and dist.get_rank() == 0:
        with open(args.times, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
