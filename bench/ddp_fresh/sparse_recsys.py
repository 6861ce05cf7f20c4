"""A fresh DDP user script for reviewing dagprof: a click-through model with sparse embedding gradients.

Habits it exercises, as recommendation users write them (none of the other fresh scripts has them):
- ``nn.EmbeddingBag(..., mode="sum", sparse=True)`` tables: DDP gives each its own bucket and all-reduces a *sparse*
  gradient (gloo all-gathers the touched rows' indices and values), not the table's dense bytes;
- two optimizers: ``SparseAdam`` over the tables, ``Adam`` over the dense MLPs, stepped one after the other;
- multi-hot categorical features as ``(input, offsets)`` pairs, ``BCEWithLogitsLoss``; ``zero_grad(set_to_none=True)``.

    dagprof profile -o runs/recsys --steps 4:10 -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/sparse_recsys.py
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class CTR(nn.Module):
    """Bottom MLP over dense features, one bag of embeddings per categorical feature, a top MLP over both."""

    def __init__(self, tables: int = 3, rows: int = 40000, dim: int = 32, dense: int = 13) -> None:
        super().__init__()
        self.embs = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(dense, 256), nn.ReLU(), nn.Linear(256, dim), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(dim * (tables + 1), 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, dense: torch.Tensor, cats: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        feats = [self.bottom(dense)] + [emb(idx, off) for emb, (idx, off) in zip(self.embs, cats)]
        return self.top(torch.cat(feats, dim=1)).squeeze(1)


def batch(n: int, tables: int, rows: int, hot: int, gen: torch.Generator):
    dense = torch.randn(n, 13, generator=gen)
    cats = []
    for _ in range(tables):
        lengths = torch.randint(1, hot + 1, (n,), generator=gen)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        cats.append((torch.randint(0, rows, (int(lengths.sum()),), generator=gen), offsets))
    return dense, cats, torch.randint(0, 2, (n,), generator=gen).float()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--hot", type=int, default=8, help="most ids per bag")
    ap.add_argument("--rows", type=int, default=40000)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(CTR(rows=args.rows))
    sparse = [p for n, p in model.named_parameters() if n.startswith("module.embs.")]
    dense = [p for n, p in model.named_parameters() if not n.startswith("module.embs.")]
    opt_sparse = torch.optim.SparseAdam(sparse, lr=1e-3)
    opt_dense = torch.optim.Adam(dense, lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        x, cats, y = batch(args.batch, len(model.module.embs), args.rows, args.hot, gen)
        loss = loss_fn(model(x, cats), y)
        loss.backward()
        opt_sparse.step()
        opt_dense.step()
        opt_sparse.zero_grad(set_to_none=True)
        opt_dense.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print(f"sparse_recsys: {args.steps} steps, loss {loss.item():.4f}, median step {statistics.median(times[min(5, len(times) // 2):]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
