"""A fresh FSDP2 user script for reviewing dagprof (stop 60): a small ConvNeXt trained with SAM (two backwards a step).

Habits it exercises, as users write them (no other fresh script has this family or this optimizer):
- ConvNeXt blocks (7x7 depthwise ``Conv2d``, channels-last ``LayerNorm``, ``Linear`` 4x up, GELU, down, a layer-scale
  ``nn.Parameter``), a patchify stem and strided downsampling between stages;
- ``fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))`` per
  block, the root last with the same policy; each block's forward under ``torch.utils.checkpoint`` (non-reentrant);
- sharpness-aware minimisation (Foret et al. 2021) written by hand: forward + backward, the gradient norm over every
  shard (``clip_grad_norm_(..., inf)``: an all-reduce of the DTensor norm), each parameter moved up its gradient by
  ``rho / norm``, forward + backward again at that point, moved back, then ``AdamW.step()``: so every optimizer step
  holds two forwards, two backwards and two sets of reduce-scatters;
- ``--no-sam`` trains with plain AdamW (one forward and backward a step), the run ``dagprof diff`` compares with;
  ``--wrap root`` calls ``fully_shard`` on the root only (one unit: what ``whatif --units merge:all`` predicts); rank 0
  prints its median step from the fourth on (``median step N ms``).

    dagprof profile -o runs/sam -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/sam_convnext.py --steps 12
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(d, d, 7, padding=3, groups=d)
        self.norm = nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.gamma = nn.Parameter(torch.full((d,), 1e-2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.down(F.gelu(self.up(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dims: tuple[int, ...], depth: int, classes: int = 100) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, dims[0], 4, stride=4)
        self.downs = nn.ModuleList(nn.Conv2d(a, b, 2, stride=2) for a, b in zip(dims, dims[1:]))
        self.stages = nn.ModuleList(nn.ModuleList(Block(d) for _ in range(depth)) for d in dims)
        self.norm, self.head = nn.LayerNorm(dims[-1]), nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i, stage in enumerate(self.stages):
            if i:
                x = self.downs[i - 1](x)
            for block in stage:
                x = checkpoint(block, x, use_reentrant=False)
        return self.head(self.norm(x.mean(dim=(2, 3))))


def grad_norm(params: list[nn.Parameter]) -> float:
    norm = torch.nn.utils.clip_grad_norm_(params, float("inf"))
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--rho", type=float, default=0.05)
    p.add_argument("--no-sam", action="store_true", help="plain AdamW: one forward and backward a step")
    p.add_argument("--wrap", choices=["blocks", "root"], default="blocks", help="fully_shard each block and the root, or the root only")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = ConvNeXt((32, 64, 128), args.depth)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for stage in model.stages if args.wrap == "blocks" else []:
        for block in stage:
            fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        img, label = torch.randn(args.batch, 3, 64, 64, generator=g), torch.randint(0, 100, (args.batch,), generator=g)
        loss = F.cross_entropy(model(img), label, label_smoothing=0.1)
        loss.backward()
        if not args.no_sam:
            scale = args.rho / (grad_norm(params) + 1e-12)
            with torch.no_grad():
                moved = [q.grad * scale for q in params]
                for q, e in zip(params, moved):
                    q.add_(e)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(img), label, label_smoothing=0.1).backward()
            with torch.no_grad():
                for q, e in zip(params, moved):
                    q.sub_(e)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
        times.append(time.perf_counter() - t0)
    if rank == 0 and len(times) > 4:
        print(f"median step {statistics.median(times[3:]) * 1e3:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
