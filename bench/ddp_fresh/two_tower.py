"""A fresh DDP user script: a two-tower retrieval model trained with in-batch negatives.

Written as a user would, knowing nothing of dagprof; held out from the PowerSGD pricing (docs/evidence.md, branch
psgdpace). Habits it has:
- a user tower: a user-id embedding plus ``nn.EmbeddingBag(mode="mean")`` over a padded, variable-length history of item
  ids (``padding_idx``), a two-layer MLP; an item tower: an item-id embedding plus an ``EmbeddingBag(mode="sum")`` over
  multi-hot tags with ``per_sample_weights``, one linear layer; both towers' outputs L2-normalised;
- dense gradients on every table (no ``sparse=True``): the tall 12,000 x 48 item table is all-reduced whole each step;
- in-batch softmax (each user's clicked item against the batch's other items) with a learnable temperature (a scalar
  parameter, clamped), ``Adam`` with ``foreach=False``, ``zero_grad()`` leaving zeroed tensors;
- DDP's default buckets on gloo, one thread per rank; a fixed synthetic click log per rank.

    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/two_tower.py --steps 16
    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/ddp_fresh/two_tower.py --steps 16" --ranks 2
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


class TwoTower(nn.Module):
    def __init__(self, users: int, items: int, tags: int, dim: int) -> None:
        super().__init__()
        self.user = nn.Embedding(users, dim)
        self.history = nn.EmbeddingBag(items + 1, dim, mode="mean", padding_idx=items)
        self.user_mlp = nn.Sequential(nn.Linear(2 * dim, 128), nn.ReLU(), nn.Linear(128, dim))
        self.item = nn.Embedding(items, dim)
        self.tags = nn.EmbeddingBag(tags, dim, mode="sum")
        self.item_mlp = nn.Linear(2 * dim, dim)
        self.log_temp = nn.Parameter(torch.tensor(2.0))

    def forward(self, uid, hist, item, tag_ids, tag_offsets, tag_weights):
        u = self.user_mlp(torch.cat([self.user(uid), self.history(hist)], dim=1))
        v = self.item_mlp(torch.cat([self.item(item), self.tags(tag_ids, tag_offsets, per_sample_weights=tag_weights)], dim=1))
        u, v = F.normalize(u, dim=1), F.normalize(v, dim=1)
        return u @ v.t() * self.log_temp.clamp(max=4.0).exp()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=4000)
    p.add_argument("--items", type=int, default=12000)
    p.add_argument("--tags", type=int, default=2000)
    p.add_argument("--dim", type=int, default=48)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--history", type=int, default=20)
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(TwoTower(args.users, args.items, args.tags, args.dim))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(7 + rank)
    n = args.batch * 32  # the rank's click log: (user, its history, the clicked item)
    log_user = torch.randint(0, args.users, (n,), generator=g)
    log_item = torch.randint(0, args.items, (n,), generator=g)
    lengths = torch.randint(1, args.history + 1, (n,), generator=g)
    log_hist = torch.randint(0, args.items, (n, args.history), generator=g)
    log_hist[torch.arange(args.history)[None, :] >= lengths[:, None]] = args.items  # padded
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        rows = torch.randint(0, n, (args.batch,), generator=g)
        counts = torch.randint(1, 6, (args.batch,), generator=g)
        tag_ids = torch.randint(0, args.tags, (int(counts.sum()),), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]])
        logits = model(log_user[rows], log_hist[rows], log_item[rows], tag_ids, offsets, torch.rand(len(tag_ids), generator=g))
        loss = F.cross_entropy(logits, torch.arange(args.batch))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"two_tower: {args.steps} steps, loss {loss.item():.3f}, median step {statistics.median(times[args.steps // 2:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
