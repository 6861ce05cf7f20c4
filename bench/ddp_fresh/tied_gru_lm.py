"""A fresh DDP user script: a word-level GRU language model whose output layer is its input embedding (tied weights).

Written as a user would, knowing nothing of dagprof; held out from the PowerSGD pricing (docs/evidence.md, branch
psgdcontend). Habits it has:
- ``self.out.weight = self.embed.weight``: one 8,192 x 96 matrix gets its gradient from the lookup (a few rows) and from
  the softmax projection (every row), so the tall gradient is dense: the shape PowerSGD compresses most;
- a GRU over 16 tokens, 16 sequences a rank, dropout, a projection back to the embedding's width before the tied output;
- ``AdamW`` with weight decay only on matrices (two parameter groups), ``clip_grad_norm_``, ``zero_grad(set_to_none=True)``;
- DDP's default buckets on gloo, one thread per rank; next-token targets from a fixed random corpus per rank.

    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/tied_gru_lm.py --steps 16
    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/ddp_fresh/tied_gru_lm.py --steps 16" --ranks 2
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


class TiedGRULM(nn.Module):
    def __init__(self, vocab: int, dim: int, hidden: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, hidden, batch_first=True)
        self.proj = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight  # tied

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.drop(self.embed(ids)))
        return self.out(self.drop(torch.tanh(self.proj(h))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(TiedGRULM(args.vocab, args.dim, args.hidden))
    decay = [q for q in model.parameters() if q.dim() >= 2]
    rest = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=3e-3)
    g = torch.Generator().manual_seed(1000 + rank)
    corpus = torch.randint(0, args.vocab, (args.batch * 64, args.seq + 1), generator=g)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        rows = torch.randint(0, len(corpus), (args.batch,), generator=g)
        x, y = corpus[rows, :-1], corpus[rows, 1:]
        loss = F.cross_entropy(model(x).reshape(-1, args.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"tied_gru_lm: {args.steps} steps, loss {loss.item():.3f}, median step {statistics.median(times[args.steps // 2:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
