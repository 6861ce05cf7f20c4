"""A fresh DDP user script: a small DLRM-style click-through model (dense features, two embedding bags, dot interactions).

Written as a user would, knowing nothing of dagprof; held out from the PowerSGD pricing (docs/evidence.md, branch
psgdemb59). Habits it has:
- a bottom MLP over 13 dense features, two ``nn.EmbeddingBag(mode="sum")`` tables over multi-hot categorical features
  (a tall 16,000 x 64 ad table, an 8,000 x 64 site table), given as flat ids with offsets;
- DLRM's pairwise dot interactions (``torch.bmm`` of the stacked vectors, the strictly lower triangle kept) into a top MLP;
- dense gradients on both tables (no ``sparse=True``): 6 MB of tables all-reduced whole each step;
- ``BCEWithLogitsLoss``, SGD with momentum and a step-decay scheduler, ``zero_grad()`` to ``None``;
- DDP's default buckets on gloo, one thread per rank; a fixed synthetic click log per rank.

    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/dlrm_mini.py --steps 16
    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/ddp_fresh/dlrm_mini.py --steps 16" --ranks 2
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def mlp(sizes: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, dense: int, tables: list[int], dim: int) -> None:
        super().__init__()
        self.bottom = mlp([dense, 128, dim], last_relu=True)
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum") for n in tables)
        k = len(tables) + 1
        self.top = mlp([dim + k * (k - 1) // 2, 128, 64, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, ids: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        vecs = torch.stack([x] + [t(i, o) for t, i, o in zip(self.tables, ids, offsets)], dim=1)
        dots = torch.bmm(vecs, vecs.transpose(1, 2))
        li, lj = torch.tril_indices(vecs.shape[1], vecs.shape[1], offset=-1)
        return self.top(torch.cat([x, dots[:, li, lj]], dim=1)).squeeze(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", default="16000,8000")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hot", type=int, default=8, help="most ids per bag")
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    sizes = [int(x) for x in args.tables.split(",")]
    model = DDP(DLRM(13, sizes, args.dim))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=8, gamma=0.5)
    loss_fn = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(11 + rank)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        dense = torch.randn(args.batch, 13, generator=g).abs().log1p()
        ids, offsets = [], []
        for n in sizes:
            counts = torch.randint(1, args.hot + 1, (args.batch,), generator=g)
            ids.append(torch.randint(0, n, (int(counts.sum()),), generator=g))
            offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]]))
        clicks = (torch.rand(args.batch, generator=g) < 0.25).float()
        loss = loss_fn(model(dense, ids, offsets), clicks)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"dlrm_mini: {args.steps} steps, loss {loss.item():.3f}, median step {statistics.median(times[args.steps // 2:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
