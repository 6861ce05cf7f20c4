"""A fresh HSDP user script for reviewing dagprof (issues 16 and 20, stop 59): a PointNet++-style point-cloud classifier, 4 ranks.

Habits it exercises, as users write them (no other fresh script has them together):
- a PointNet++ set model: two set-abstraction layers (farthest-point sampling in a Python loop, k-nearest-neighbour
  grouping by ``torch.cdist`` + ``topk`` and ``gather``, a shared 1x1-conv MLP with BatchNorm, max-pool over each group),
  then a global PointNet layer and an MLP head with dropout;
- HSDP through ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))``; each set-abstraction layer,
  the global layer and the head are units; the head, the last unit to run forward and the first in backward, keeps its
  parameters gathered (``reshard_after_forward=False``; ``--reshard-last`` reshards it too); no mixed precision;
- per-batch augmentation (a random rotation about the vertical axis, jitter, random scaling), RAdam with decoupled
  weight decay, ``ReduceLROnPlateau`` on the validation loss all-reduced at each epoch's end.

    dagprof profile -o runs/pn2 -- torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/hsdp_pointnet2.py --steps 12
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def farthest_points(xyz: torch.Tensor, m: int) -> torch.Tensor:
    b, n, _ = xyz.shape
    idx = torch.zeros(b, m, dtype=torch.long)
    dist_ = torch.full((b, n), float("inf"))
    far = torch.zeros(b, dtype=torch.long)
    rows = torch.arange(b)
    for i in range(m):
        idx[:, i] = far
        d = ((xyz - xyz[rows, far][:, None]) ** 2).sum(-1)
        dist_ = torch.minimum(dist_, d)
        far = dist_.argmax(-1)
    return idx


def gather_points(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (B, N, C), idx (B, ...) -> (B, ..., C)."""
    flat = idx.reshape(idx.shape[0], -1)
    out = x.gather(1, flat[..., None].expand(-1, -1, x.shape[-1]))
    return out.view(*idx.shape, x.shape[-1])


class SetAbstraction(nn.Module):
    def __init__(self, centres: int, k: int, c_in: int, widths: tuple[int, ...]) -> None:
        super().__init__()
        self.centres, self.k = centres, k
        layers, c = [], c_in + 3
        for w in widths:
            layers += [nn.Conv2d(c, w, 1), nn.BatchNorm2d(w), nn.ReLU()]
            c = w
        self.mlp = nn.Sequential(*layers)

    def forward(self, xyz: torch.Tensor, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            centre_idx = farthest_points(xyz, self.centres)
            centres = gather_points(xyz, centre_idx)
            knn = torch.cdist(centres, xyz).topk(self.k, dim=-1, largest=False).indices
        local = gather_points(xyz, knn) - centres[:, :, None]
        grouped = torch.cat([local, gather_points(feats, knn)], dim=-1)
        h = self.mlp(grouped.permute(0, 3, 1, 2))
        return centres, h.max(dim=-1).values.transpose(1, 2)


class PointNet2(nn.Module):
    def __init__(self, classes: int = 16) -> None:
        super().__init__()
        self.sa1 = SetAbstraction(128, 16, 3, (64, 64, 128))
        self.sa2 = SetAbstraction(32, 16, 128, (128, 128, 256))
        self.glob = nn.Sequential(nn.Linear(256 + 3, 256), nn.ReLU(), nn.Linear(256, 512))
        self.head = nn.Sequential(nn.Linear(512, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Dropout(0.4), nn.Linear(256, classes))

    def forward(self, xyz: torch.Tensor) -> torch.Tensor:
        c1, f1 = self.sa1(xyz, xyz)
        c2, f2 = self.sa2(c1, f1)
        return self.head(self.glob(torch.cat([c2, f2], dim=-1)).max(dim=1).values)


def augment(xyz: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    theta = torch.rand(xyz.shape[0], generator=g) * 2 * math.pi
    c, s = torch.cos(theta), torch.sin(theta)
    z, o = torch.zeros_like(c), torch.ones_like(c)
    rot = torch.stack([c, z, s, z, o, z, -s, z, c], dim=-1).view(-1, 3, 3)
    scale = 0.8 + 0.4 * torch.rand(xyz.shape[0], 1, 1, generator=g)
    return (xyz @ rot) * scale + 0.01 * torch.randn(xyz.shape, generator=g)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--points", type=int, default=512)
    p.add_argument("--epoch-steps", type=int, default=5)
    p.add_argument("--reshard-last", action="store_true", help="the head reshards after forward too")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = PointNet2()
    for unit in (model.sa1, model.sa2, model.glob):
        fully_shard(unit, mesh=mesh)
    fully_shard(model.head, mesh=mesh, reshard_after_forward=args.reshard_last)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.RAdam(model.parameters(), lr=1e-3, weight_decay=1e-4, decoupled_weight_decay=True)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    g = torch.Generator().manual_seed(50 + rank)
    clouds = torch.randn(args.steps + 1, args.batch, args.points, 3, generator=g)
    labels = torch.randint(0, 16, (args.steps + 1, args.batch), generator=g)
    val_x, val_y = torch.randn(args.batch, args.points, 3, generator=g), torch.randint(0, 16, (args.batch,), generator=g)
    for step in range(args.steps):
        model.train()
        loss = F.cross_entropy(model(augment(clouds[step], g)), labels[step])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % args.epoch_steps == 0:
            model.eval()
            with torch.no_grad():
                val = F.cross_entropy(model(val_x), val_y).detach()
            dist.all_reduce(val)
            val /= world
            plateau.step(val.item())
            if rank == 0:
                print(f"step {step} train {loss.item():.3f} val {val.item():.3f} lr {opt.param_groups[0]['lr']:.1e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
