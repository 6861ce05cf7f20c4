"""A fresh HSDP user script for reviewing dagprof (issue 16): a plain VGG-style conv net on a 2 x 2 mesh of 4 ranks.

Habits it exercises, as users write them (none of the other fresh scripts has them together):
- HSDP: ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))``, every unit on that mesh;
- units that are ``nn.Sequential`` slices of one flat feature stack (conv-BN-ReLU, max-pool between stages), regrouped
  by index as a user ports a torchvision VGG, and the classifier its own unit; BatchNorm running stats (buffers) in each;
- gradient accumulation: ``set_requires_gradient_sync(False)`` on every micro-batch but the last of ``--accum`` (3),
  the loss divided by the micro-batch count;
- ``SGD(momentum=0.9, weight_decay=5e-4)`` with a ``StepLR``, dropout in the classifier, ``channels_last`` inputs.

    dagprof profile -o runs/vgg -- torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/hsdp_vgg_accum.py --steps 12
    torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/hsdp_vgg_accum.py --memory /tmp/vgg-mem   # peak per rank
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

CFG = [16, 16, "M", 32, 32, "M", 64, 64, "M"]


def vgg_features() -> nn.Sequential:
    layers: list[nn.Module] = []
    cin = 3
    for v in CFG:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1, bias=False), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
            cin = v
    return nn.Sequential(*layers)


class VGG(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = vgg_features()
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 4 * 4, 256), nn.ReLU(True), nn.Dropout(0.3),
                                        nn.Linear(256, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(0)
    model = VGG()
    # the flat feature stack regrouped into stages, one per max-pool, each a unit
    cuts = [0] + [i + 1 for i, m in enumerate(model.features) if isinstance(m, nn.MaxPool2d)]
    model.features = nn.Sequential(*(nn.Sequential(*model.features[a:b]) for a, b in zip(cuts, cuts[1:])))
    for stage in model.features:
        fully_shard(stage, mesh=mesh)
    fully_shard(model.classifier, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=8, gamma=0.5)
    g = torch.Generator().manual_seed(rank)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    for step in range(args.steps):
        with peaks.step():
            for micro in range(args.accum):
                model.set_requires_gradient_sync(micro == args.accum - 1)
                x = torch.randn(args.batch, 3, 32, 32, generator=g).contiguous(memory_format=torch.channels_last)
                y = torch.randint(0, 10, (args.batch,), generator=g)
                loss = F.cross_entropy(model(x), y) / args.accum
                loss.backward()
            opt.step()
            opt.zero_grad()
        sched.step()
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item() * args.accum:.3f}", flush=True)
    peaks.save(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
