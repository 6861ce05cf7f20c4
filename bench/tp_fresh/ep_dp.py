"""A fresh expert-parallel-ish x data-parallel job for reviewing dagprof's mesh labels (issue 16), 2 or 4 ranks.

Each rank holds one expert (a 2-layer MLP); a router sends each token to an expert by ``all_to_all_single`` (autograd:
``torch.distributed.nn.functional``), the experts run, and a second all-to-all brings the tokens back; backward runs
both exchanges in reverse. The dense part (input projection, head) is DDP over every rank; the
experts are outside DDP (each rank's own), as in expert parallelism.

    dagprof profile -o runs/ep -- torchrun --standalone --nproc-per-node 2 bench/tp_fresh/ep_dp.py
    torchrun --standalone --nproc-per-node 2 bench/tp_fresh/ep_dp.py --trace traces/ep_dp
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from common import init, loop, parse
from torch.distributed.nn.functional import all_to_all_single
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH, TOKENS = 64, 64


class Dense(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor, moe: nn.Module) -> torch.Tensor:
        h = self.proj(x)
        return self.head(h + moe(h))


class MoE(nn.Module):
    """This rank's expert between two all-to-alls (a balanced router: TOKENS / world tokens to each expert)."""

    def __init__(self) -> None:
        super().__init__()
        self.expert = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        routed = all_to_all_single(torch.empty_like(h), h.contiguous())
        return all_to_all_single(torch.empty_like(routed), self.expert(routed).contiguous())


def main() -> None:
    args = parse(__doc__)
    rank = init()
    torch.manual_seed(0)
    dense = DDP(Dense())
    torch.manual_seed(100 + rank)
    moe = MoE()
    opt = torch.optim.Adam([*dense.parameters(), *moe.parameters()], lr=1e-3)
    x, y = torch.randn(TOKENS, WIDTH), torch.randint(0, 10, (TOKENS,))

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(dense(x, moe), y).backward()
        opt.step()

    loop(args, step)


if __name__ == "__main__":
    main()
