"""A fresh FSDP2 user script for reviewing dagprof (review6): a small ConvNeXt-style CNN with bf16 mixed precision.

Habits it exercises, as users write them from the FSDP2 docs (not dagprof's own scripts, nor the ResNet/GRU ones):
- ConvNeXt blocks: depthwise 7x7 conv, LayerNorm over channels (channels-last ``permute``), an inverted-bottleneck
  MLP with GELU, layer scale, stochastic depth (per-sample drop path, so ranks draw different masks);
- ``fully_shard`` on every block and on each downsampling layer, then on the root, each with
  ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``;
- gradient accumulation: ``model.set_requires_gradient_sync(False)`` (and ``set_reshard_after_backward(False)``) on
  every micro-batch but the last of ``--accum``;
- ``clip_grad_norm_`` on the DTensor gradients, ``AdamW(foreach=True)``, a warm-up then cosine schedule
  (``SequentialLR`` of ``LinearLR`` and ``CosineAnnealingLR``), ``zero_grad(set_to_none=True)``.

    dagprof profile -o runs/convnext -- torchrun --standalone --nproc-per-node 2 bench/review6/convnext_accum.py --steps 20
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, drop_path: float) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))
        self.drop_path = drop_path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x).permute(0, 2, 3, 1)
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        h = h.permute(0, 3, 1, 2)
        if self.training and self.drop_path > 0:
            keep = torch.rand(x.shape[0], 1, 1, 1, dtype=x.dtype) >= self.drop_path
            h = h * keep / (1 - self.drop_path)
        return x + h


class ConvNeXt(nn.Module):
    def __init__(self, dims=(32, 64), depths=(2, 2), classes: int = 100) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, stride=4), LayerNorm2d(dims[0], eps=1e-6))
        rates = torch.linspace(0, 0.1, sum(depths)).tolist()
        self.downsample = nn.ModuleList()
        self.stages = nn.ModuleList()
        k = 0
        for i, (d, n) in enumerate(zip(dims, depths)):
            if i:
                self.downsample.append(nn.Sequential(LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], d, 2, stride=2)))
            self.stages.append(nn.Sequential(*(ConvNeXtBlock(d, rates[k + j]) for j in range(n))))
            k += n
        self.head_norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i, stage in enumerate(self.stages):
            if i:
                x = self.downsample[i - 1](x)
            x = stage(x)
        return self.head(self.head_norm(x.mean((2, 3))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--keep-gathered", action="store_true", help="reshard_after_forward=False on every unit")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = ConvNeXt()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for down in model.downsample:
        fully_shard(down, mp_policy=mp, reshard_after_forward=not args.keep_gathered)
    for stage in model.stages:
        for block in stage:
            fully_shard(block, mp_policy=mp, reshard_after_forward=not args.keep_gathered)
    fully_shard(model, mp_policy=mp, reshard_after_forward=not args.keep_gathered)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05, foreach=True)
    warm = 3
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt, [torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=warm),
              torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, args.steps - warm))], milestones=[warm])
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    model.train()
    for step in range(args.steps):
        for micro in range(args.accum):
            last = micro == args.accum - 1
            model.set_requires_gradient_sync(last)
            model.set_reshard_after_backward(last)
            x = torch.randn(args.batch, 3, 32, 32, generator=g)
            y = torch.randint(0, 100, (args.batch,), generator=g)
            loss = F.cross_entropy(model(x).float(), y) / args.accum
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if dist.get_rank() == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item() * args.accum:.3f} grad-norm {norm.full_tensor().item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
