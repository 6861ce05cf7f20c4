"""A fresh user script for reviewing dagprof (issue 16): an expert-parallel mixture-of-experts layer beside a DDP dense
part, whose token exchange is an all-to-all large enough to matter on a slow link.

Each rank holds one expert; a balanced router sends each rank's tokens to the experts with ``all_to_all_single`` from
``torch.distributed.nn.functional`` (autograd: backward runs both exchanges in reverse), the experts run, and a second
all-to-all brings the tokens back; the embedding-like input projection and the classifier head are DDP over every rank,
the experts outside it, as expert parallelism puts them; the dense part's BatchNorm has its running statistics broadcast
by DDP (``broadcast_buffers=True``) before each forward. AdamW, a step's loss all-reduced for the log line every 5 steps.
Prints the median step from step 5 on (``zero1_measure.py --script`` reads it).

    dagprof profile -o runs/moe_a2a -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/moe_a2a.py --steps 20
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.nn.functional import all_to_all_single
from torch.nn.parallel import DistributedDataParallel as DDP


class Dense(nn.Module):
    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width)  # running statistics: DDP broadcasts them from rank 0 before each forward
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, moe: nn.Module) -> torch.Tensor:
        h = self.norm(self.proj(x))
        return self.head(h + moe(h))


class Expert(nn.Module):
    """This rank's expert between the two exchanges."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.ffn = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        routed = all_to_all_single(torch.empty_like(h), h.contiguous())
        return all_to_all_single(torch.empty_like(routed), self.ffn(routed).contiguous())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per rank")
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    dense = DDP(Dense(args.width, 10))
    torch.manual_seed(100 + rank)
    expert = Expert(args.width)
    opt = torch.optim.AdamW([*dense.parameters(), *expert.parameters()], lr=1e-3)
    x, y = torch.randn(args.tokens, args.width), torch.randint(0, 10, (args.tokens,))
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(dense(x, expert), y)
        loss.backward()
        opt.step()
        if step % 5 == 4:
            logged = loss.detach().clone()
            dist.all_reduce(logged)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        tail = sorted(times[5:])
        print(f"moe_a2a: {args.steps} steps, {args.tokens} tokens x {args.width} per rank, loss {loss.item():.3f}, "
              f"median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
