"""A fresh HSDP user script for reviewing dagprof (stop 63): a query/passage dual encoder for dense retrieval, 4 ranks.

Habits it exercises, as retrieval users write them (no other fresh script has this family or these habits together):
- two different towers under one root: a pre-norm transformer for queries (each block run through
  ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``) and a character CNN for passages (embedding, three
  dilated ``Conv1d`` stages, max-pooled), each projected to a shared space; a learnable temperature on the root;
- HSDP on ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))``, every block and stage its own
  unit, with ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``; the root alone
  ``reshard_after_forward=False`` (its own parameters stay gathered between forward and backward);
- in-batch negatives over every rank: both sides' embeddings all-gathered with the autograd
  ``torch.distributed.nn.functional.all_gather`` inside the loss (its backward sums the gathered gradients back);
- gradient accumulation over ``--accum`` micro-batches with ``set_requires_gradient_sync(False)`` on all but the
  last, ``clip_grad_norm_(1.0)`` over the sharded gradients, ``AdamW`` and a ``CosineAnnealingLR``.
Without a profiler it prints its median step from step 4 on.

    dagprof profile -o runs/dual -- torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/hsdp_dual_encoder.py
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnnf
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

WORDS, CHARS, QLEN, PLEN = 4000, 96, 16, 96


class QueryBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, key_padding_mask=pad, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class QueryTower(nn.Module):
    def __init__(self, dim: int, depth: int, out: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(WORDS, dim, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(QLEN, dim) * 0.02)
        self.blocks = nn.ModuleList(QueryBlock(dim) for _ in range(depth))
        self.proj = nn.Linear(dim, out)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == 0
        x = self.embed(ids) + self.pos
        for block in self.blocks:
            x = checkpoint(block, x, pad, use_reentrant=False)
        keep = (~pad).unsqueeze(-1).to(x.dtype)
        return self.proj((x * keep).sum(1) / keep.sum(1).clamp(min=1))


class PassageTower(nn.Module):
    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(CHARS, dim)
        self.stages = nn.ModuleList(
            nn.Sequential(nn.Conv1d(dim, dim, 3, padding=d, dilation=d), nn.GroupNorm(4, dim), nn.GELU()) for d in (1, 2, 4))
        self.proj = nn.Linear(dim, out)

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        x = self.embed(chars).transpose(1, 2)
        for stage in self.stages:
            x = x + stage(x)
        return self.proj(x.amax(dim=2))


class DualEncoder(nn.Module):
    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        self.query = QueryTower(dim, 3, out)
        self.passage = PassageTower(dim, out)
        self.log_scale = nn.Parameter(torch.tensor([2.6]))  # fully_shard takes no 0-d parameter

    def forward(self, ids: torch.Tensor, chars: torch.Tensor) -> torch.Tensor:
        q = F.normalize(self.query(ids).float(), dim=-1)
        p = F.normalize(self.passage(chars).float(), dim=-1)
        all_q, all_p = torch.cat(dnnf.all_gather(q)), torch.cat(dnnf.all_gather(p))
        logits = self.log_scale.float().exp().clamp(max=100) * all_q @ all_p.T
        target = torch.arange(len(all_q))
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def batch(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, WORDS, (n, QLEN), generator=g)
    lengths = torch.randint(4, QLEN + 1, (n,), generator=g)
    ids[torch.arange(QLEN)[None, :] >= lengths[:, None]] = 0
    return ids, torch.randint(0, CHARS, (n, PLEN), generator=g)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--shard", type=int, default=0, help="the mesh's shard degree (default: half the ranks; 2 ranks with "
                   "--shard 2 run 1x2, the replicate degree grown to 2 at 4 ranks)")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    shard = args.shard or dist.get_world_size() // 2
    mesh = init_device_mesh("cpu", (dist.get_world_size() // shard, shard), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = DualEncoder(args.dim, 64)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for unit in [*model.query.blocks, *model.passage.stages]:
        fully_shard(unit, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    g = torch.Generator().manual_seed(100 + rank)
    times: list[float] = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        for micro in range(args.accum):
            model.set_requires_gradient_sync(micro == args.accum - 1)
            loss = model(*batch(g, args.batch)) / args.accum
            loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        times.append(time.perf_counter() - t0)
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item() * args.accum:.3f}", flush=True)
    if rank == 0 and len(times) > 4:
        print(f"median step {1000 * statistics.median(times[4:]):.1f} ms over {len(times) - 4} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
