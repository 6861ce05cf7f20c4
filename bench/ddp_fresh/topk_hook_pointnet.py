"""A fresh DDP user script for reviewing dagprof: a PointNet classifier whose gradients are sparsified to their top-k by
a comm hook the user wrote.

Habits it exercises, as users write them:
- ``register_comm_hook(state, topk_hook)`` with a state object of the user's (the ratio, and each bucket's error
  feedback: what top-k left out is added to the next step's gradient): per bucket, the k largest magnitudes' values
  (fp32) and indices (int64) are all-gathered from every rank with ``async_op=True`` (two ``dist.all_gather`` of lists),
  and the future of both (``torch.futures.collect_all``) scatter-adds them into the averaged gradient; k is a fixed share
  of the bucket, so each rank sends the same bytes every step, and more ranks gather more;
- a PointNet (shared per-point MLP as 1x1 convolutions, BatchNorm, max pooling, an FC head with dropout) on synthetic
  point clouds, SGD with momentum, ``bucket_cap_mb=4``.

Without a profiler it prints its median step from step 5 on (``zero1_measure.py --script`` reads it).

    dagprof profile -o runs/topk -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/topk_hook_pointnet.py --steps 12
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class TopK:
    ratio: float
    residual: dict[int, torch.Tensor] = field(default_factory=dict)


def topk_hook(state: TopK, bucket):  # DDP refuses a "bucket" annotation other than its own GradBucket class
    grad = bucket.buffer()
    world = dist.get_world_size()
    acc = grad + state.residual.get(bucket.index(), 0)
    k = max(1, int(state.ratio * acc.numel()))
    _, idx = acc.abs().topk(k, sorted=False)
    vals = acc[idx]
    state.residual[bucket.index()] = acc.index_fill(0, idx, 0.0)
    all_vals = [torch.empty_like(vals) for _ in range(world)]
    all_idx = [torch.empty_like(idx) for _ in range(world)]
    futs = [dist.all_gather(all_vals, vals, async_op=True).get_future(),
            dist.all_gather(all_idx, idx, async_op=True).get_future()]

    def dense(_: torch.futures.Future) -> torch.Tensor:
        grad.zero_()
        for v, i in zip(all_vals, all_idx):
            grad.index_add_(0, i, v)
        return grad.div_(world)

    return torch.futures.collect_all(futs).then(dense)


class PointNet(nn.Module):
    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        chans = [3, 64, 128, width]
        self.points = nn.Sequential(*[m for a, b in zip(chans, chans[1:]) for m in (nn.Conv1d(a, b, 1), nn.BatchNorm1d(b), nn.ReLU())])
        self.head = nn.Sequential(nn.Linear(width, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Dropout(0.3),
                                  nn.Linear(512, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: batch x 3 x points
        return self.head(self.points(x).max(dim=2).values)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--points", type=int, default=256)
    ap.add_argument("--width", type=int, default=1024, help="the per-point feature width (1024: 0.8 M parameters)")
    ap.add_argument("--ratio", type=float, default=0.05, help="the share of each bucket's gradients sent")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(PointNet(args.width, 40), bucket_cap_mb=4)
    model.register_comm_hook(TopK(args.ratio), topk_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        x = torch.randn(args.batch, 3, args.points, generator=gen)
        y = torch.randint(0, 40, (args.batch,), generator=gen)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[5:])
        print(f"topk_hook_pointnet: {args.steps} steps, loss {loss.item():.3f}, median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
