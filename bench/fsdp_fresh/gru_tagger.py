"""A fresh user script for judging dagprof's DDP -> FSDP conversion on a recurrent family none of the kept pairs has:
a stacked GRU sequence tagger, as a user writes one.

Habits it exercises (not the mixer, ResNet, LoRA, recommender or transformer LM the conversion was judged on):
- an embedding, ``--depth`` blocks of a one-layer ``nn.GRU`` each, with a residual, ``LayerNorm`` and a feed-forward
  projection, and a per-token tag head;
- ``--wrap fsdp``: ``fully_shard`` on every ``model.blocks[i]`` then the root; ``--wrap ddp``: ``DistributedDataParallel``;
- ``SGD`` with Nesterov momentum, a step LR schedule, no gradient clipping, token-level cross-entropy with padding
  (``ignore_index``) on random sequences.

    dagprof profile -o runs/gru-ddp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/gru_tagger.py --wrap ddp
    dagprof whatif runs/gru-ddp --data-parallel fsdp     # against: the same with --wrap fsdp
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

PAD = -100


class GRUBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(x)
        x = self.norm(x + h)
        return x + self.proj(x)


class Tagger(nn.Module):
    def __init__(self, vocab: int, dim: int, depth: int, tags: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(GRUBlock(dim) for _ in range(depth))
        self.head = nn.Linear(dim, tags)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Tagger(args.vocab, args.dim, args.depth, 17)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
        tags = torch.randint(0, 17, (args.batch, args.seq), generator=gen)
        tags[:, -4:] = PAD  # padded tails
        loss = F.cross_entropy(model(ids).reshape(-1, 17), tags.reshape(-1), ignore_index=PAD)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
