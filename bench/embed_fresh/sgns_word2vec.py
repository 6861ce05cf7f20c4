"""A fresh embedding job (issue 20, held out for PowerSGD's pricing): word2vec's skip-gram with negative sampling
(Mikolov et al. 2013) under DDP, as a user ports the original C tool.

Habits, as users write them (no other fresh script has this family or these habits together):
- two tables and nothing else (``in_embed`` for centre words, ``out_embed`` for contexts, no bias, no dense layer): the
  whole gradient is two dense embedding matrices (``sparse=False``, which DDP needs);
- a synthetic Zipf corpus, frequent words subsampled (the ``1e-3`` threshold), a dynamic window (1..5 words each side),
  5 negatives a pair drawn from the unigram distribution to the 3/4 power with ``torch.multinomial``;
- plain SGD whose learning rate decays linearly to 0 by hand (word2vec's schedule), the output table zero-initialised
  and the input one uniform in +-0.5/dim (the C tool's), loss summed over pairs, then divided by the batch.

    dagprof profile -o runs/sgns -- torchrun --standalone --nproc-per-node 2 bench/embed_fresh/sgns_word2vec.py --steps 14
    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/embed_fresh/sgns_word2vec.py --steps 16" \
        --ranks 2 --link 200Mbit --modes lossy --rounds 4 --budget 5 --no-extras --link-model-calibrate
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

VOCAB, DIM, NEG, WINDOW = 12000, 64, 5, 5


class SkipGram(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.in_embed = nn.Embedding(VOCAB, DIM)
        self.out_embed = nn.Embedding(VOCAB, DIM)
        nn.init.uniform_(self.in_embed.weight, -0.5 / DIM, 0.5 / DIM)
        nn.init.zeros_(self.out_embed.weight)

    def forward(self, centre: torch.Tensor, context: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        v = self.in_embed(centre)  # (B, D)
        pos = (v * self.out_embed(context)).sum(1)
        neg = torch.bmm(self.out_embed(negatives), v.unsqueeze(2)).squeeze(2)  # (B, NEG)
        return -(F.logsigmoid(pos) + F.logsigmoid(-neg).sum(1)).sum()


def corpus(n: int, gen: torch.Generator) -> torch.Tensor:
    """Zipf-distributed word ids, frequent ones subsampled as word2vec does."""
    freq = 1.0 / torch.arange(1, VOCAB + 1, dtype=torch.float64)
    freq /= freq.sum()
    words = torch.multinomial(freq, n, replacement=True, generator=gen)
    keep = torch.rand(n, generator=gen, dtype=torch.float64) < ((freq[words] / 1e-3).sqrt() + 1) * 1e-3 / freq[words]
    return words[keep]


def pairs(text: torch.Tensor, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` (centre, context) pairs with word2vec's dynamic window."""
    at = torch.randint(WINDOW, len(text) - WINDOW, (batch,), generator=gen)
    reach = torch.randint(1, WINDOW + 1, (batch,), generator=gen)
    off = torch.randint(0, 2 * WINDOW, (batch,), generator=gen) % (2 * reach) - reach
    off = torch.where(off >= 0, off + 1, off)
    return text[at], text[at + off]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4096)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(SkipGram())
    lr0 = 0.025
    opt = torch.optim.SGD(model.parameters(), lr=lr0)
    gen = torch.Generator().manual_seed(77 + rank)
    text = corpus(400_000, gen)
    unigram = torch.bincount(text, minlength=VOCAB).double() ** 0.75
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        centre, context = pairs(text, a.batch, gen)
        negatives = torch.multinomial(unigram, a.batch * NEG, replacement=True, generator=gen).view(a.batch, NEG)
        for g in opt.param_groups:
            g["lr"] = max(lr0 * 1e-4, lr0 * (1 - step / a.steps))
        loss = model(centre, context, negatives) / a.batch
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"sgns: loss {loss.item():.4f}, median step {statistics.median(times[3:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
