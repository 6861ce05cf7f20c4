"""A fresh DDP user script for reviewing dagprof: a dual-encoder retrieval model whose collectives are asynchronous.

Habits it exercises, as users write them:
- SimCLR's ``GatherLayer`` (an autograd Function) to score each query against every rank's documents: its forward
  all-gathers them with ``dist.all_gather(..., async_op=True)``, copies this rank's own slice while that is in flight,
  then ``work.wait()``; its backward all-reduces the gathered gradients asynchronously and waits before it returns;
- every rank's queries all-gathered with ``dist.all_gather_into_tensor(..., async_op=True)`` in the model's own
  ``forward`` for a uniformity term (Wang & Isola), the document tower computed while they are in flight, ``work.wait()``
  only after the contrastive loss;
- a DINO-style ``Centering`` module whose running centre of the documents' embeddings is averaged over the ranks with
  the functional collectives DTensor uses (``torch.distributed._functional_collectives.all_reduce``), waited for where
  it is first used;
- AdamW, ``zero_grad(set_to_none=True)``; gloo, 2 ranks.

    dagprof profile -o runs/retrieval -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/async_retrieval.py --steps 30
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Centering(nn.Module):
    """A running centre of the embeddings over every rank's batch, taken off them (DINO's ``update_center``)."""

    def __init__(self, dim: int, momentum: float = 0.9) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("center", torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = funcol.all_reduce(x.detach().mean(0), "sum", dist.group.WORLD)
        out = x - self.center
        self.center.mul_(self.momentum).add_(batch / dist.get_world_size(), alpha=1 - self.momentum)  # first use: waits
        return out


class GatherLayer(torch.autograd.Function):
    """Every rank's rows, gradients flowing back to each rank's own (SimCLR's ``GatherLayer``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        work = dist.all_gather(out, x.contiguous(), async_op=True)
        own = x.clone()  # this rank's slice, while the others are in flight
        work.wait()
        out[dist.get_rank()] = own
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> torch.Tensor:
        both = torch.stack(grads)
        work = dist.all_reduce(both, async_op=True)
        work.wait()
        return both[dist.get_rank()]


class Retrieval(nn.Module):
    def __init__(self, vocab: int, features: int, width: int, dim: int) -> None:
        super().__init__()
        self.query_embed = nn.EmbeddingBag(vocab, width, mode="mean")
        self.query = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, dim))
        self.doc = nn.Sequential(nn.Linear(features, width), nn.GELU(), nn.LayerNorm(width), nn.Linear(width, dim))
        self.center = Centering(dim)

    def forward(self, tokens: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
        q = F.normalize(self.query(self.query_embed(tokens)), dim=-1)
        bank = torch.empty(dist.get_world_size() * len(q), q.shape[1])
        work = dist.all_gather_into_tensor(bank, q.detach().contiguous(), async_op=True)  # every rank's queries
        d = F.normalize(self.center(self.doc(docs)), dim=-1)  # the document tower runs while they are in flight
        keys = torch.cat(GatherLayer.apply(d))
        loss = F.cross_entropy(20.0 * q @ keys.T, torch.arange(len(q)) + dist.get_rank() * len(q))
        work.wait()
        uniformity = torch.logsumexp(-2.0 * torch.cdist(q, bank).pow(2), dim=1).mean()  # against every rank's queries
        return loss + 0.1 * uniformity


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--seq", type=int, default=24)
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--lr", type=float, default=5e-4)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Retrieval(args.vocab, args.features, args.width, args.dim))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    torch.manual_seed(1 + rank)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq))
        docs = torch.randn(args.batch, args.features)
        loss = model(tokens, docs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        tail = sorted(times[5:])
        print(f"async_retrieval: {args.steps} steps, {n / 1e6:.2f} M params, loss {loss.item():.3f}, "
              f"median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
