"""A fresh DDP user script for reviewing dagprof (review6): an LSTM sequence tagger with uneven inputs under ``join()``.

Habits it exercises, as users write them from the DDP docs (not dagprof's own scripts, nor the GRU/GPT ones):
- a bidirectional two-layer LSTM tagger with an embedding and a CRF-free linear head, packed by nothing (fixed length);
- a ``TensorDataset`` through a ``DistributedSampler(shuffle=True, drop_last=False)`` and a ``DataLoader``
  (``set_epoch`` per epoch), where each rank then keeps a different number of batches (rank r drops its last r*2),
  so the ranks' inputs are uneven and the loop runs inside ``with model.join():``;
- ``no_sync()`` on the first of ``--accum`` micro-batches, ``torch.autocast("cpu", dtype=torch.bfloat16)`` around
  forward and loss, ``gradient_as_bucket_view=True``, ``bucket_cap_mb=2`` (``--bucket-mb``);
- ``SGD(momentum=0.9)`` with ``ExponentialLR``, ``clip_grad_norm_``.

    dagprof profile -o runs/lstm -- torchrun --standalone --nproc-per-node 2 bench/review6/lstm_join.py --steps 20
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Tagger(nn.Module):
    def __init__(self, vocab: int = 3000, d: int = 96, hidden: int = 128, tags: int = 17) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True, bidirectional=True, dropout=0.1)
        self.head = nn.Linear(2 * hidden, tags)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20, help="optimizer steps of the rank with the most data")
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=40)
    p.add_argument("--bucket-mb", type=float, default=2)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    n = args.steps * args.accum * args.batch * world
    data = TensorDataset(torch.randint(1, 3000, (n, args.seq)), torch.randint(0, 17, (n, args.seq)))
    sampler = DistributedSampler(data, shuffle=True, drop_last=False)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    model = DDP(Tagger(), gradient_as_bucket_view=True, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.98)
    sampler.set_epoch(0)
    batches = list(loader)[: len(loader) - 2 * rank * args.accum]  # uneven: rank r has 2*r optimizer steps fewer
    with model.join():
        for i, (tokens, tags) in enumerate(batches):
            last = (i + 1) % args.accum == 0
            with contextlib.nullcontext() if last else model.no_sync():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(tokens).flatten(0, 1), tags.flatten()) / args.accum
                loss.backward()
            if last:
                nn.utils.clip_grad_norm_(model.parameters(), 5.0)
                opt.step()
                sched.step()
                opt.zero_grad()
                if rank == 0 and (i // args.accum) % 5 == 0:
                    print(f"step {i // args.accum} loss {loss.item() * args.accum:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
