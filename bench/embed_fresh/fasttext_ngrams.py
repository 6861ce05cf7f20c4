"""A fresh embedding job (issue 20, held out for PowerSGD's pricing): a fastText-style text classifier (Joulin et al.
2017) under DDP, documents as bags of words and hashed bigrams averaged by one ``nn.EmbeddingBag``.

Habits, as users write them (no other fresh script has this family or these habits together):
- one ``EmbeddingBag(mode="mean")`` over words and their bigrams hashed into the same 65,536 buckets (the hashing
  trick for n-grams), fed flat ids with ``offsets`` (no padding), documents of varying length from a Zipf vocabulary;
- a single linear layer to 24 topic labels, ``label_smoothing`` in the cross entropy;
- SGD with Nesterov momentum and a linear decay to zero by ``LambdaLR`` (fastText's schedule), ``clip_grad_norm_``
  at 5 by the gradients' inf-norm, ``DDP(model, broadcast_buffers=False)``.

    dagprof profile -o runs/fasttext -- torchrun --standalone --nproc-per-node 2 bench/embed_fresh/fasttext_ngrams.py --steps 14
    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/embed_fresh/fasttext_ngrams.py --steps 14" \
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

VOCAB, BUCKETS, DIM, LABELS = 30000, 2**16, 32, 24


class FastText(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(BUCKETS, DIM, mode="mean")
        self.out = nn.Linear(DIM, LABELS)
        nn.init.uniform_(self.bag.weight, -1 / DIM, 1 / DIM)
        nn.init.zeros_(self.out.weight)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.out(self.bag(ids, offsets))


def documents(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flat word and hashed-bigram ids with each document's offset, and labels from each document's first frequent word."""
    lengths = torch.randint(8, 120, (n,), generator=gen)
    words = (torch.rand(int(lengths.sum()), generator=gen) ** 4 * VOCAB).long()  # Zipf-like: a few words very common
    ids, offsets, labels, at = [], [], [], 0
    for length in lengths.tolist():
        w = words[at : at + length]
        at += length
        bigrams = (w[:-1] * 1_000_003 + w[1:]) % BUCKETS
        ids += [w % BUCKETS, bigrams]
        offsets.append(length + len(bigrams))
        labels.append(int(w[w > 50][0] % LABELS) if (w > 50).any() else 0)
    offsets = torch.tensor([0] + offsets[:-1]).cumsum(0)
    return torch.cat(ids), offsets, torch.tensor(labels)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(FastText(), broadcast_buffers=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / a.steps))
    gen = torch.Generator().manual_seed(11 + rank)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        ids, offsets, labels = documents(a.batch, gen)
        loss = F.cross_entropy(model(ids, offsets), labels, label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0, norm_type=float("inf"))
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"fasttext: loss {loss.item():.4f}, median step {statistics.median(times[3:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
