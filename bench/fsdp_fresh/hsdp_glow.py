"""A fresh HSDP user script for reviewing dagprof (stop 66): a small multi-scale Glow normalizing flow on images.

The family no other script in this folder has: a Glow (Kingma & Dhariwal 2018) density model, two levels of squeeze
then ``--depth`` flow steps (ActNorm, an invertible 1x1 convolution whose log-determinant comes from ``slogdet``, an
affine coupling whose scale and shift come from a zero-initialised conv net), half the channels split off after the
first level under a learned conv prior. Habits, as flow users write them:
- HSDP on ``init_device_mesh("cpu", (R, S), mesh_dim_names=("dp_replicate", "dp_shard"))`` (not the
  "replicate"/"shard" names), every flow step its own unit, the priors in the root's; full fp32 (no mixed precision:
  log-determinants in bf16 diverge);
- ActNorm's data-dependent initialisation: one ``torch.no_grad()`` forward of the first batch before sharding, which
  sets every ActNorm's bias and log-scale from that batch's statistics (an all-reduce per ActNorm over the ranks);
- uniform dequantisation noise, the loss in bits per dimension, ``clip_grad_value_(5.0)`` then ``clip_grad_norm_(100.)``,
  ``Adamax`` with an ``ExponentialLR`` decay, ``zero_grad()`` (set to None, the default).
Without a profiler it prints its median step from step 4 on.

    dagprof profile -o runs/glow -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/hsdp_glow.py --shard 2
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class ActNorm(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1, c, 1, 1))
        self.logs = nn.Parameter(torch.zeros(1, c, 1, 1))
        self.init_from_data = False

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.init_from_data:
            with torch.no_grad():
                mean = x.mean(dim=(0, 2, 3), keepdim=True)
                var = ((x - mean) ** 2).mean(dim=(0, 2, 3), keepdim=True)
                stats = torch.cat([mean, var])
                dist.all_reduce(stats)
                mean, var = stats / dist.get_world_size()
                self.bias.copy_(-mean[None])
                self.logs.copy_(-0.5 * torch.log(var[None] + 1e-6))
            self.init_from_data = False
        return (x + self.bias) * self.logs.exp(), self.logs.sum() * x.shape[2] * x.shape[3]


class InvConv(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linalg.qr(torch.randn(c, c))[0].contiguous())  # fully_shard takes contiguous parameters only

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.conv2d(x, self.weight[:, :, None, None]), torch.linalg.slogdet(self.weight)[1] * x.shape[2] * x.shape[3]


class Coupling(nn.Module):
    def __init__(self, c: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(c // 2, hidden, 3, padding=1), nn.ReLU(), nn.Conv2d(hidden, hidden, 1), nn.ReLU(),
                                 nn.Conv2d(hidden, c, 3, padding=1))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = x.chunk(2, dim=1)
        shift, raw = self.net(a).chunk(2, dim=1)
        scale = torch.sigmoid(raw + 2.0)
        return torch.cat([a, (b + shift) * scale], dim=1), scale.log().flatten(1).sum(1)


class FlowStep(nn.Module):
    def __init__(self, c: int, hidden: int) -> None:
        super().__init__()
        self.norm, self.mix, self.couple = ActNorm(c), InvConv(c), Coupling(c, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, a = self.norm(x)
        x, b = self.mix(x)
        x, c = self.couple(x)
        return x, a + b + c


def squeeze(x: torch.Tensor) -> torch.Tensor:
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, 4 * c, h // 2, w // 2)


def gaussian_logp(x: torch.Tensor, mean: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    return (-0.5 * (math.log(2 * math.pi) + 2 * logs + (x - mean) ** 2 * torch.exp(-2 * logs))).flatten(1).sum(1)


class Glow(nn.Module):
    def __init__(self, depth: int, hidden: int) -> None:
        super().__init__()
        self.level1 = nn.ModuleList(FlowStep(12, hidden) for _ in range(depth))
        self.level2 = nn.ModuleList(FlowStep(24, hidden) for _ in range(depth))
        self.split_prior = nn.Conv2d(6, 12, 3, padding=1)
        self.top_prior = nn.Parameter(torch.zeros(1, 48, 4, 4))
        nn.init.zeros_(self.split_prior.weight)
        nn.init.zeros_(self.split_prior.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Log-likelihood of each image, nats."""
        x, logdet = squeeze(x), torch.zeros(x.shape[0])
        for step in self.level1:
            x, ld = step(x)
            logdet = logdet + ld
        x, z1 = x.chunk(2, dim=1)
        mean, logs = self.split_prior(x).chunk(2, dim=1)
        logp = gaussian_logp(z1, mean, logs)
        x = squeeze(x)
        for step in self.level2:
            x, ld = step(x)
            logdet = logdet + ld
        mean, logs = self.top_prior.chunk(2, dim=1)
        return logp + gaussian_logp(x, mean, logs) + logdet


def images(g: torch.Generator, n: int) -> torch.Tensor:
    """8-bit-like images with some structure (smooth blobs), dequantised to [0, 1) with uniform noise."""
    base = F.interpolate(torch.rand(n, 3, 4, 4, generator=g), size=16, mode="bilinear", align_corners=False)
    q = torch.floor(base * 255)
    return (q + torch.rand(q.shape, generator=g)) / 256 - 0.5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--batch", type=int, default=24)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--hidden", type=int, default=160)
    p.add_argument("--shard", type=int, default=0, help="the mesh's shard degree (default: every rank; 2 ranks with "
                   "--shard 2 run 1x2, the replicate degree grown to 2 at 4 ranks)")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = args.shard or world
    mesh = init_device_mesh("cpu", (world // shard, shard), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(0)
    model = Glow(args.depth, args.hidden)
    g = torch.Generator().manual_seed(11 + rank)
    dims = 3 * 16 * 16
    for m in model.modules():
        if isinstance(m, ActNorm):
            m.init_from_data = True
    with torch.no_grad():  # before sharding: FSDP2 would not write a unit's gathered parameters back to its shards
        model(images(g, args.batch))
    for step in [*model.level1, *model.level2]:
        fully_shard(step, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adamax(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.98)
    times: list[float] = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x = images(g, args.batch)
        bpd = -(model(x) - dims * math.log(256)).mean() / (dims * math.log(2))
        bpd.backward()
        nn.utils.clip_grad_value_(model.parameters(), 5.0)
        nn.utils.clip_grad_norm_(model.parameters(), 100.0)
        opt.step()
        opt.zero_grad()
        sched.step()
        times.append(time.perf_counter() - t0)
        if rank == 0 and step % 4 == 0:
            print(f"step {step} bits/dim {bpd.item():.3f}", flush=True)
    if rank == 0 and len(times) > 4:
        print(f"median step {1000 * statistics.median(times[4:]):.1f} ms over {len(times) - 4} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
