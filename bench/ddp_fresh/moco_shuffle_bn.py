"""A fresh DDP user script for reviewing dagprof (stop 60): MoCo v2 contrastive pre-training with shuffled BatchNorm.

Habits it exercises, as MoCo users write them (no other fresh script has this family or these collectives):
- a query encoder (small ResNet-ish conv net with ``BatchNorm2d``, 2-layer MLP head) wrapped in DDP with its default
  ``broadcast_buffers=True`` (rank 0's BN running stats broadcast at every forward);
- a key encoder, a deep copy kept outside DDP (``requires_grad_(False)``), updated by momentum from the query
  encoder's weights before each key forward;
- MoCo's shuffling BN: the key batch all-gathered from every rank (``concat_all_gather``, no autograd), a permutation
  drawn on rank 0 and broadcast, each rank encoding its slice of the shuffled batch, then un-shuffled by a second
  all-gather: three collectives a step in the forward, outside DDP's buckets;
- a queue of 2,048 negative keys, enqueued from every rank's keys (the un-shuffled all-gathered keys);
- InfoNCE over 1 positive and the queue, ``SGD(momentum=0.9, weight_decay=1e-4)``, a cosine ``LambdaLR``.

    dagprof profile -o runs/moco -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/moco_shuffle_bn.py --steps 16
"""
from __future__ import annotations

import argparse
import copy
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def conv_bn(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Encoder(nn.Module):
    def __init__(self, width: int, dim: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(3, width), conv_bn(width, width), conv_bn(width, 2 * width, 2),
                                  conv_bn(2 * width, 2 * width), conv_bn(2 * width, 4 * width, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(4 * width, 4 * width), nn.ReLU(inplace=True), nn.Linear(4 * width, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.body(x)), dim=1)


@torch.no_grad()
def concat_all_gather(t: torch.Tensor) -> torch.Tensor:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.cat(out)


@torch.no_grad()
def shuffled_keys(key_enc: nn.Module, im_k: torch.Tensor) -> torch.Tensor:
    """MoCo's batch shuffle: each rank's BN sees a mix of every rank's images, so BN cannot leak the positive."""
    n, rank = im_k.shape[0], dist.get_rank()
    every = concat_all_gather(im_k)
    perm = torch.randperm(every.shape[0]) if rank == 0 else torch.empty(every.shape[0], dtype=torch.long)
    dist.broadcast(perm, src=0)
    k = key_enc(every[perm.view(-1, n)[rank]])
    every_k = concat_all_gather(k)
    return every_k[torch.argsort(perm)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--queue", type=int, default=2048)
    p.add_argument("--momentum", type=float, default=0.99)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = Encoder(args.width, 64)
    key_enc = copy.deepcopy(net).requires_grad_(False)
    model = DDP(net)
    queue = F.normalize(torch.randn(args.queue, 64), dim=1)
    ptr = 0
    opt = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        base = torch.rand(args.batch, 3, 32, 32, generator=g)
        im_q = base + 0.1 * torch.randn(base.shape, generator=g)
        im_k = torch.flip(base, dims=[3]) + 0.1 * torch.randn(base.shape, generator=g)
        q = model(im_q)
        with torch.no_grad():
            for pq, pk in zip(net.parameters(), key_enc.parameters()):
                pk.mul_(args.momentum).add_(pq.detach(), alpha=1 - args.momentum)
            every_k = shuffled_keys(key_enc, im_k)
            k = every_k[rank * args.batch:(rank + 1) * args.batch]
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.t()], dim=1) / 0.2
        loss = F.cross_entropy(logits, torch.zeros(args.batch, dtype=torch.long))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        queue[ptr:ptr + every_k.shape[0]] = every_k
        ptr = (ptr + every_k.shape[0]) % args.queue
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.3f} lr {sched.get_last_lr()[0]:.4f} world {world}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
