"""A fresh FSDP2 user script for reviewing dagprof (stop 61): DINO self-distillation (Caron et al. 2021) on a tiny ViT.

Habits it exercises, as DINO users write them (no other fresh script has this family or these habits):
- a student and a teacher ViT, each ``fully_shard`` per block and at the root: the teacher has no optimizer and runs
  forward only under ``torch.no_grad()`` (its all-gathers with no backward, no reduce-scatter), then ``reshard()``:
  FSDP2 leaves a root's parameters unsharded after its forward, so the EMA below met full tensors beside shards;
- the teacher updated as an EMA of the student on the local shards (``torch._foreach_mul_`` / ``_foreach_add_`` over
  ``DTensor.to_local()``), its momentum on a cosine schedule;
- multi-crop: two 32x32 global crops (student and teacher) and ``--local-crops`` 16x16 ones (student only), the
  student called once per resolution (its position embedding interpolated by ``F.interpolate``);
- the teacher's output centred by an EMA of its batch mean, averaged over the ranks by the user's own
  ``dist.all_reduce`` each step;
- the last layer's gradients cancelled for the first ``--freeze-last`` steps (``p.grad = None`` on its DTensors), weight
  decay on matrices only (two AdamW parameter groups), ``clip_grad_norm_(3.0)`` over the sharded gradients;
- ``--local-crops 0`` trains on the global crops only (the run ``dagprof diff`` compares with); rank 0 prints its median
  step from the fourth on (``median step N ms``);
- ``--ddp``: the same loop with the student in ``DistributedDataParallel`` and the teacher a plain module.

    dagprof profile -o runs/dino -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/dino_ema_teacher.py --steps 12
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel


class Block(nn.Module):
    def __init__(self, d: int, heads: int = 3) -> None:
        super().__init__()
        self.n1, self.attn = nn.LayerNorm(d), nn.MultiheadAttention(d, heads, batch_first=True)
        self.n2, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.n1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.n2(x))


class ViT(nn.Module):
    def __init__(self, d: int = 96, depth: int = 4, out: int = 512, patch: int = 4) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, d, 8, 8) * 0.02)  # for 32x32 crops, interpolated for others
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Sequential(nn.Linear(d, 256), nn.GELU(), nn.Linear(256, 64))
        self.last = nn.utils.parametrizations.weight_norm(nn.Linear(64, out, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.patch(x)
        h = (h + F.interpolate(self.pos, size=h.shape[-2:], mode="bicubic", align_corners=False)).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(len(h), -1, -1), h], 1)
        for block in self.blocks:
            h = block(h)
        return self.last(F.normalize(self.head(self.norm(h[:, 0])), dim=-1))


def shard(model: ViT, reshard: bool | None) -> ViT:
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    return model


def crops(g: torch.Generator, images: torch.Tensor, size: int, n: int) -> torch.Tensor:
    """``n`` random crops of each image resized to ``size`` (a user's augmentation, on tensors)."""
    out = []
    for _ in range(n):
        s = int(torch.randint(16, 33, (), generator=g))
        i, j = (int(torch.randint(0, 33 - s, (), generator=g)) for _ in range(2))
        out.append(F.interpolate(images[:, :, i:i + s, j:j + s], size=size, mode="bilinear", align_corners=False))
    return torch.cat(out)


def dino_loss(student: torch.Tensor, teacher: torch.Tensor, center: torch.Tensor, n_global: int) -> torch.Tensor:
    t = F.softmax((teacher - center) / 0.04, dim=-1).chunk(n_global)
    s = F.log_softmax(student / 0.1, dim=-1).chunk(len(student) // len(t[0]))
    pairs = [(i, j) for i in range(len(t)) for j in range(len(s)) if i != j]
    return sum(-(t[i] * s[j]).sum(-1).mean() for i, j in pairs) / len(pairs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--local-crops", type=int, default=4)
    p.add_argument("--freeze-last", type=int, default=3)
    p.add_argument("--reshard", choices=("on", "off"), default=None, help="every unit's reshard_after_forward (default: fully_shard's)")
    p.add_argument("--ddp", action="store_true", help="the student in DistributedDataParallel, the teacher a plain module (the held-out "
                   "run of whatif --data-parallel ddp)")
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    reshard = None if args.reshard is None else args.reshard == "on"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    student, teacher = ViT(), ViT()
    teacher.load_state_dict(student.state_dict())
    teacher.requires_grad_(False)
    plain = student
    student, teacher = (DistributedDataParallel(student), teacher) if args.ddp else (shard(student, reshard), shard(teacher, reshard))
    decay = [q for n, q in plain.named_parameters() if q.ndim > 1]
    no_decay = [q for n, q in plain.named_parameters() if q.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.04}, {"params": no_decay, "weight_decay": 0.0}], lr=5e-4)
    last = [q for n, q in plain.named_parameters() if n.startswith("last.")]
    center = torch.zeros(1, 512)
    g = torch.Generator().manual_seed(7 + rank)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, nn.ModuleList([student, teacher]), opt)
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        with peaks.step():
            images = torch.rand(args.batch, 3, 48, 48, generator=g)
            global_views = crops(g, images, 32, 2)
            with torch.no_grad():
                t_out = teacher(global_views)
            if not args.ddp:
                teacher.reshard()  # FSDP2 keeps the root's parameters unsharded after a forward (backward would need them)
            if reshard is False and not args.ddp:  # every unit kept unsharded after its no-grad forward: the EMA below needs their shards
                for block in teacher.blocks:
                    block.reshard()
            s_out = student(global_views)
            if args.local_crops:
                s_out = torch.cat([s_out, student(crops(g, images, 16, args.local_crops))])
            loss = dino_loss(s_out, t_out, center, 2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if step < args.freeze_last:
                for q in last:
                    q.grad = None
            torch.nn.utils.clip_grad_norm_(student.parameters(), 3.0)
            opt.step()
            with torch.no_grad():
                m = 1 - (1 - 0.996) * (math.cos(math.pi * step / args.steps) + 1) / 2
                t_local = [q.to_local() if isinstance(q, DTensor) else q for q in teacher.parameters()]
                s_local = [q.to_local() if isinstance(q, DTensor) else q for q in plain.parameters()]
                torch._foreach_mul_(t_local, m)
                torch._foreach_add_(t_local, s_local, alpha=1 - m)
                batch_center = t_out.sum(0, keepdim=True)
                dist.all_reduce(batch_center)
                center = center * 0.9 + batch_center / (len(t_out) * dist.get_world_size()) * 0.1
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.4f} momentum {m:.4f}", flush=True)
        times.append(time.perf_counter() - t0)
    peaks.save(rank)
    if rank == 0 and len(times) > 4:
        print(f"median step {statistics.median(times[3:]) * 1e3:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
