"""A fresh HSDP user script for reviewing dagprof (issue 16): a small ResNet-ish conv net on a 2-D mesh.

Habits it exercises, as users write them (not dagprof's own fsdp_train.py):
- HSDP: ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))`` on 4 ranks, every unit on that mesh;
- units that are stages of residual blocks (``fully_shard`` on each block, then on its stage: nested units);
- a frozen stem (``requires_grad_(False)``) inside the root unit; BatchNorm buffers (not sharded);
- the last stage kept gathered (``reshard_after_forward=False``), the others resharded;
- SGD with Nesterov momentum (``foreach``), label smoothing, ``clip_grad_norm_`` on the DTensor gradients.

    dagprof profile -o runs/hsdp -- torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/hsdp_convnet.py --steps 20
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class Net(nn.Module):
    def __init__(self, width: int, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.stages = nn.Sequential(*(nn.Sequential(Block(width), Block(width)) for _ in range(2)))
        self.fc = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=48)
    p.add_argument("--replicate", type=int, default=2)
    p.add_argument("--flat", action="store_true", help="fully_shard on the root only: what whatif --units merge:all predicts")
    args = p.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (args.replicate, world // args.replicate), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = Net(args.width)
    model.stem.requires_grad_(False)
    last = len(model.stages) - 1
    for i, stage in enumerate([] if args.flat else model.stages):
        for block in stage:
            fully_shard(block, mesh=mesh)
        fully_shard(stage, mesh=mesh, reshard_after_forward=i != last)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD([q for q in model.parameters() if q.requires_grad], lr=0.05, momentum=0.9, nesterov=True, foreach=True)
    g = torch.Generator().manual_seed(dist.get_rank())
    model.train()
    for step in range(args.steps):
        x = torch.randn(8, 3, 16, 16, generator=g)
        y = torch.randint(0, 10, (8,), generator=g)
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=2.0)
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
