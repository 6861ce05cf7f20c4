"""A fresh DDP user script for reviewing dagprof: a GRU encoder-decoder (copy-reverse task) with a comm hook of its own.

Habits it exercises, as users write them (none of the other fresh DDP scripts has them):
- ``nn.GRU`` encoder and decoder (2 layers each, teacher forcing), embeddings and an output projection;
- ``DistributedDataParallel(static_graph=True)``;
- the user's own comm hook (not one of torch's): each bucket divided by the world size and all-reduced with
  ``dist.all_reduce(..., async_op=True)``, its future chained;
- ``SGD`` with Nesterov momentum, gradient clipping by value, a label-smoothed loss.

    dagprof profile -o runs/gru -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/gru_seq2seq_hook.py --steps 12
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, BOS = 64, 1


def mean_allreduce_hook(group: dist.ProcessGroup, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket averaged over the ranks: divided first, then summed."""
    buf = bucket.buffer().div_(dist.get_world_size(group))
    work = dist.all_reduce(buf, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class Seq2Seq(nn.Module):
    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.src_embed = nn.Embedding(VOCAB, d)
        self.tgt_embed = nn.Embedding(VOCAB, d)
        self.encoder = nn.GRU(d, d, num_layers=2, batch_first=True)
        self.decoder = nn.GRU(d, d, num_layers=2, batch_first=True)
        self.out = nn.Linear(d, VOCAB)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        _, h = self.encoder(self.src_embed(src))
        y, _ = self.decoder(self.tgt_embed(tgt_in), h)
        return self.out(y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=20)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Seq2Seq(args.width), static_graph=True)
    model.register_comm_hook(dist.group.WORLD, mean_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    gen = torch.Generator().manual_seed(rank)
    for _step in range(args.steps):
        src = torch.randint(2, VOCAB, (args.batch, args.length), generator=gen)
        tgt = src.flip(1)
        tgt_in = torch.cat([torch.full((args.batch, 1), BOS), tgt[:, :-1]], dim=1)
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1), label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
        opt.step()
    if rank == 0:
        print(f"gru_seq2seq_hook: {args.steps} steps, loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
