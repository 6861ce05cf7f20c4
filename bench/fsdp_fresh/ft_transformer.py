"""A fresh FSDP2 user script for reviewing dagprof (stop 65): an FT-Transformer classifying synthetic tabular rows.

Habits it exercises, as tabular-deep-learning users write them (no other fresh script has this family or these together):
- a feature tokenizer: each numeric column its own weight and bias vector, the categorical columns one ``nn.Embedding``
  with per-column offsets, a learned [CLS] token; pre-norm blocks with ``F.scaled_dot_product_attention``;
- ``fully_shard`` on every block and the root with ``MixedPrecisionPolicy(param_dtype=torch.bfloat16,
  reduce_dtype=torch.float32)``, and ``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`` on every block;
- ``AdamW`` with two parameter groups (no weight decay on norms, biases and embeddings), a cosine schedule with linear
  warm-up through ``LambdaLR``;
- a ``TensorDataset`` in a ``DataLoader`` with ``DistributedSampler(drop_last=True)``; an evaluation pass every
  ``--eval-every`` steps (``model.eval()`` under ``torch.no_grad``, the accuracy all-reduced), then back to training.
Without a profiler it prints its median step from step 4 on (the evaluation steps included, as a user would time it).

    dagprof profile -o runs/ftt -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/ft_transformer.py
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def tabular(rows: int, numeric: int, cards: list[int]) -> TensorDataset:
    """Rows whose label depends on a few numeric columns and one categorical interaction (a planted rule)."""
    g = torch.Generator().manual_seed(3)
    num = torch.randn(rows, numeric, generator=g)
    cat = torch.stack([torch.randint(c, (rows,), generator=g) for c in cards], 1)
    logit = num[:, 0] * num[:, 1] - num[:, 2] + 0.8 * ((cat[:, 0] % 3) == (cat[:, 1] % 3)).float()
    return TensorDataset(num, cat, (logit > 0).float())


class Tokenizer(nn.Module):
    def __init__(self, numeric: int, cards: list[int], d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(numeric, d) / math.sqrt(d))
        self.bias = nn.Parameter(torch.zeros(numeric, d))
        self.register_buffer("offsets", torch.tensor([0] + cards[:-1]).cumsum(0), persistent=False)
        self.embed = nn.Embedding(sum(cards), d)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)

    def forward(self, num: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        tokens = torch.cat([num[..., None] * self.weight + self.bias, self.embed(cat + self.offsets)], 1)
        return torch.cat([self.cls.expand(num.shape[0], -1, -1), tokens], 1)


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ffn = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.ffn(self.norm2(x))


class FTTransformer(nn.Module):
    def __init__(self, numeric: int, cards: list[int], d: int, depth: int, heads: int) -> None:
        super().__init__()
        self.tok = Tokenizer(numeric, cards, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(d), nn.ReLU(), nn.Linear(d, 1))

    def forward(self, num: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        x = self.tok(num, cat)
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False)
        return self.head(x[:, 0]).squeeze(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=64, help="rows per rank and step")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=6)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    cards = [12, 7, 30, 5, 100]
    model = FTTransformer(24, cards, args.dim, args.depth, 8)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 1e-5}, {"params": rest, "weight_decay": 0.0}], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / args.warmup if s < args.warmup else
                                              0.5 * (1 + math.cos(math.pi * (s - args.warmup) / max(1, args.steps - args.warmup))))
    train, valid = tabular(40_000, 24, cards), tabular(1_024, 24, cards)
    sampler = DistributedSampler(train, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler, drop_last=True)
    vloader = DataLoader(valid, batch_size=512, sampler=DistributedSampler(valid, shuffle=False))
    stamps: list[float] = []
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for num, cat, y in loader:
            model.train()
            loss = F.binary_cross_entropy_with_logits(model(num, cat).float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % args.eval_every == 0:
                model.eval()
                hits = torch.zeros(2)
                with torch.no_grad():
                    for vnum, vcat, vy in vloader:
                        hits += torch.tensor([((model(vnum, vcat) > 0).float() == vy).sum().item(), vy.numel()])
                dist.all_reduce(hits)
                if rank == 0:
                    print(f"step {step} loss {loss.item():.3f} val acc {hits[0] / hits[1]:.3f}", flush=True)
            stamps.append(time.perf_counter())
            if step == args.steps:
                break
        epoch += 1
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][3:]
    if rank == 0 and gaps:
        print(f"median step {1000 * statistics.median(gaps):.1f} ms over {len(gaps)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
