"""A fresh DDP user script for reviewing dagprof: the user's own fp16 compression hook and bucket views.

Habits it exercises, as users write them:
- ``register_comm_hook(None, fp16_compress_hook)`` right after wrapping (the wire carries half the gradient bytes);
- ``gradient_as_bucket_view=True`` and ``bucket_cap_mb=4``;
- a small convnet on 32x32 images, SGD with Nesterov momentum and weight decay, ``zero_grad(set_to_none=False)``.

    dagprof profile -o runs/fp16 -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/fp16_hook.py --steps 20
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel as DDP


def convnet(width: int) -> nn.Module:
    def stage(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

    return nn.Sequential(stage(3, 32), stage(32, 64), stage(64, 128), nn.Flatten(),
                         nn.Linear(128 * 4 * 4, width), nn.ReLU(), nn.Linear(width, 10))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=512, help="the hidden layer's width (4096: 34 MB of fp32 gradients, 17 MB on the wire)")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = DDP(convnet(args.width), gradient_as_bucket_view=True, bucket_cap_mb=4)
    model.register_comm_hook(None, fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    for _ in range(args.steps):
        x, y = torch.randn(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
    if dist.get_rank() == 0:
        print(f"fp16_hook: {args.steps} steps, loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
