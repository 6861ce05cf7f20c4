"""A fresh user-style job under the composable ``replicate()`` (issue 16): a click-through-rate model whose user set small
buckets (the judge of ``dagprof optimize --verify`` on replicate(): its strategy is applied to the module by the bootstrap).

Habits, as users write them (no other fresh script has this family or these habits together):
- a DCN-v2 style ranker (Wang et al. 2021): categorical fields embedded (one table per field, ``nn.EmbeddingBag`` over
  a few hashed ids each, mean-pooled), dense features through a bottom MLP, three full-rank cross layers, a deep tower;
- ``replicate(model, bucket_cap_mb=0.1)``: small buckets, on the belief that more of them overlap better with backward;
- ``torch.optim.Adagrad`` on everything, BCE-with-logits on a clicked/not label drawn from a hidden logistic model, the
  batch streamed from a generator each step (no DataLoader), the AUC-free loss printed at the end.

    dagprof profile -o runs/ctr -- torchrun --standalone --nproc-per-node 2 bench/replicate_fresh/ctr_small_buckets.py --steps 12
    dagprof optimize runs/ctr --verify -- torchrun --standalone --nproc-per-node 2 bench/replicate_fresh/ctr_small_buckets.py
    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/replicate_fresh/ctr_small_buckets.py --steps 14" \
        --ranks 2 --link 200Mbit --modes lossless,lossy --rounds 4 --budget 5 --no-extras   # on an emulated 2-host cluster
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._composable import replicate
from torch.nn.parallel import DistributedDataParallel as DDP

FIELDS, VOCAB, BAG, DENSE = 12, 2000, 4, 16


class Cross(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.w = nn.Linear(dim, dim)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x0 * self.w(x) + x


class Ranker(nn.Module):
    def __init__(self, emb: int = 32, hidden: int = 512):
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(VOCAB, emb, mode="mean") for _ in range(FIELDS))
        self.bottom = nn.Sequential(nn.Linear(DENSE, 128), nn.ReLU(), nn.Linear(128, emb), nn.ReLU())
        dim = emb * (FIELDS + 1)
        self.cross = nn.ModuleList(Cross(dim) for _ in range(3))
        self.deep = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden // 2), nn.ReLU())
        self.head = nn.Linear(hidden // 2 + dim, 1)

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([t(ids[:, f]) for f, t in enumerate(self.tables)] + [self.bottom(dense)], dim=1)
        x = x0
        for c in self.cross:
            x = c(x0, x)
        return self.head(torch.cat([x, self.deep(x0)], dim=1)).squeeze(1)


def batch(n: int, gen: torch.Generator, truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (n, FIELDS, BAG), generator=gen)
    dense = torch.randn(n, DENSE, generator=gen)
    logit = dense @ truth + (ids[:, :, 0] % 7 == 0).float().sum(1) - 1.5
    return ids, dense, torch.bernoulli(torch.sigmoid(logit), generator=gen)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--ddp", action="store_true", help="the same job under DistributedDataParallel (the bench's control)")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Ranker(), bucket_cap_mb=0.1) if a.ddp else replicate(Ranker(), bucket_cap_mb=0.1)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.02)
    gen = torch.Generator().manual_seed(1234 + rank)
    truth = torch.randn(DENSE, generator=torch.Generator().manual_seed(5))
    loss_fn = nn.BCEWithLogitsLoss()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        ids, dense, y = batch(a.batch, gen, truth)
        loss = loss_fn(model(ids, dense), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"ctr: bce {loss.item():.4f}, median step {statistics.median(times[3:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
