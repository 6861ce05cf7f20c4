"""A held-out DDP job, written as a user would: a small VGG-style image classifier (conv gradients).

Three 3x3 conv blocks (64, 128, 256 channels, batch norm, max-pooling) on 32x32 images and a two-layer
classifier head, under plain DDP, gloo on CPU, one thread per rank. Its gradients are the shapes PowerSGD
meets in a CNN: 4-d conv kernels (viewed as out x in*k*k), a wide linear, biases and batch-norm vectors.
The script knows nothing of dagprof; dagprof's PowerSGD pricing was developed on ``ddp_heldout_embed.py``:

    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/ddp_heldout_conv.py --steps 16" --ranks 2
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))


def vgg() -> nn.Sequential:
    return nn.Sequential(block(3, 64), block(64, 128), block(128, 256), nn.Flatten(), nn.Linear(256 * 4 * 4, 512), nn.ReLU(), nn.Linear(512, 10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(vgg())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        x = torch.randn(args.batch, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (args.batch,), generator=g)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
