"""A fresh embedding job (issue 20, held out for PowerSGD's pricing): a session-based recommender in the GRU4Rec
style (Hidasi et al. 2016) under DDP, next-item prediction scored against in-batch and sampled negatives.

Habits, as users write them (no other fresh script has this family or these habits together):
- an item table shared by the input and the output (the scores are dot products with item rows: weight tying by
  reuse, not by a tied ``Linear``), a category table beside it concatenated per position, a one-layer GRU over the
  session, a small projection back to the item space;
- sessions drawn from a popularity-skewed item distribution with a category per item, padded to a fixed length with
  a padding id of 0 (``padding_idx=0``), the last position's hidden state scoring the next item;
- the BPR-max-like loss over 64 shared negatives sampled by popularity, Adam, ``clip_grad_norm_`` at 5 every step,
  ``DDP(model, bucket_cap_mb=4)`` (the user's own cap).

    dagprof profile -o runs/gru4rec -- torchrun --standalone --nproc-per-node 2 bench/embed_fresh/gru4rec_sessions.py --steps 14
    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/embed_fresh/gru4rec_sessions.py --steps 14" \
        --ranks 2 --link 200Mbit --modes lossy --rounds 3 --budget 5 --no-extras --link-model-calibrate
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ITEMS, CATS, LEN, NEG = 16000, 300, 12, 64


class Sessions(nn.Module):
    def __init__(self, dim: int = 48, cat_dim: int = 16, hidden: int = 96):
        super().__init__()
        self.items = nn.Embedding(ITEMS, dim, padding_idx=0)
        self.cats = nn.Embedding(CATS, cat_dim, padding_idx=0)
        self.gru = nn.GRU(dim + cat_dim, hidden, batch_first=True)
        self.out = nn.Linear(hidden, dim)

    def forward(self, seq: torch.Tensor, cat: torch.Tensor, target: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(torch.cat([self.items(seq), self.cats(cat)], dim=2))
        u = self.out(h[:, -1])  # (B, dim)
        pos = (u * self.items(target)).sum(1, keepdim=True)
        neg = u @ self.items(negatives).T  # (B, NEG), shared negatives
        weight = F.softmax(neg, dim=1)
        return -torch.log((weight * torch.sigmoid(pos - neg)).sum(1) + 1e-10).mean()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Sessions(), bucket_cap_mb=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(31 + rank)
    pop = 1.0 / torch.arange(1, ITEMS, dtype=torch.float64) ** 0.8  # ids 1.. (0 pads)
    category = torch.randint(1, CATS, (ITEMS,), generator=torch.Generator().manual_seed(3))
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        seq = torch.multinomial(pop, a.batch * (LEN + 1), replacement=True, generator=gen).view(a.batch, LEN + 1) + 1
        short = torch.randint(2, LEN + 1, (a.batch,), generator=gen)
        seq[:, :LEN][torch.arange(LEN) < (LEN - short).unsqueeze(1)] = 0  # left-padded sessions
        negatives = torch.multinomial(pop, NEG, replacement=True, generator=gen) + 1
        loss = model(seq[:, :LEN], category[seq[:, :LEN]] * (seq[:, :LEN] > 0), seq[:, LEN], negatives)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"gru4rec: loss {loss.item():.4f}, median step {statistics.median(times[3:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
