"""A fresh DDP user script for reviewing dagprof: ranks with uneven numbers of batches, handled by ``Join``.

Habits it exercises, as users write them:
- each rank's shard of a dataset has a different length (rank r gets ``--batches + r * --extra`` batches), as a
  ``DataLoader`` over an unevenly split dataset gives; no ``DistributedSampler`` padding;
- ``with Join([model]):`` around the loop: a rank that runs out of batches shadows the others' collectives (DDP's
  join hook all-reduces zeros for every gradient bucket and for the "still joined?" flag of each step) until every
  rank is done, so the last rank runs steps alone while the first only answers them;
- an MLP regressor with dropout, Adam, ``zero_grad(set_to_none=True)``.

    dagprof profile -o runs/join -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/join_uneven.py
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def mlp(features: int, width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(features, width), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1)]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=20, help="batches on rank 0")
    ap.add_argument("--extra", type=int, default=6, help="more batches on each next rank")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(mlp(args.features, args.width, args.depth), bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)
    n = args.batches + rank * args.extra
    data = [(torch.randn(args.batch, args.features, generator=g), torch.randn(args.batch, 1, generator=g)) for _ in range(n)]
    times = []
    with Join([model]):
        for x, y in data:
            t0 = time.perf_counter()
            loss = F.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
    tail = sorted(times[min(5, len(times) - 1):])
    print(f"join_uneven rank {rank}: {n} batches, {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params, "
          f"loss {loss.item():.3f}, median step {1e3 * tail[len(tail) // 2]:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
