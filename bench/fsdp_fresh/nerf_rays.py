"""A fresh FSDP2 user script for reviewing dagprof (stop 64): a NeRF-style coordinate MLP fitted to rays of a synthetic scene.

Habits it exercises, as neural-field users write them (no other fresh script has this family or these habits together):
- Fourier positional encodings of points and view directions, a coarse and a fine MLP (8 layers of ``--width`` with a
  skip concatenation at layer 4), hierarchical sampling (inverse-CDF sampling of the coarse weights with
  ``torch.searchsorted``) and volume rendering by hand (``cumprod`` of transmittance);
- ``fully_shard`` on the coarse and the fine MLP, then on the root, all fp32;
- the rays from a ``DataLoader`` over a map-style dataset with ``DistributedSampler`` (``set_epoch`` each epoch),
  ``num_workers=2``, ``persistent_workers=True``: the batches are built in worker processes beside the ranks;
- ``Adam``, an ``ExponentialLR`` stepped every step, ``clip_grad_norm_(1.0)`` over the sharded gradients, a PSNR logged
  every ``--log-every`` steps through a blocking ``all_reduce`` of the loss.
Without a profiler it prints its median step from step 4 on.

    dagprof profile -o runs/nerf -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/nerf_rays.py
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
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def encode(x: torch.Tensor, bands: int) -> torch.Tensor:
    """x and sin/cos of x at ``bands`` octaves (NeRF's gamma)."""
    freq = 2.0 ** torch.arange(bands) * math.pi
    xf = x[..., None] * freq
    return torch.cat([x, xf.sin().flatten(-2), xf.cos().flatten(-2)], -1)


class Rays(Dataset):
    """Rays through a unit cube's pixels looking at a soft coloured sphere; each item: origin, direction, colour."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        origin = torch.tensor([0.0, 0.0, -3.0]) + 0.1 * torch.randn(3, generator=g)
        d = F.normalize(torch.tensor([0.0, 0.0, 1.0]) + 0.4 * (torch.rand(3, generator=g) - 0.5), dim=0)
        closest = origin - (origin @ d) * d  # the ray's point nearest the sphere's centre (the origin)
        hit = torch.exp(-4 * closest.norm() ** 2)
        return origin, d, hit * (0.5 + 0.5 * torch.cat([d[:2], d[2:].abs()]))


class FieldMLP(nn.Module):
    def __init__(self, width: int, bands: int = 10, view_bands: int = 4) -> None:
        super().__init__()
        self.bands, self.view_bands = bands, view_bands
        din, dview = 3 + 6 * bands, 3 + 6 * view_bands
        self.first = nn.ModuleList([nn.Linear(din, width)] + [nn.Linear(width, width) for _ in range(3)])
        self.second = nn.ModuleList([nn.Linear(width + din, width)] + [nn.Linear(width, width) for _ in range(3)])
        self.sigma = nn.Linear(width, 1)
        self.feature = nn.Linear(width, width)
        self.rgb = nn.Sequential(nn.Linear(width + dview, width // 2), nn.ReLU(), nn.Linear(width // 2, 3))

    def forward(self, pts: torch.Tensor, dirs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = encode(pts, self.bands)
        h = x
        for layer in self.first:
            h = F.relu(layer(h))
        h = torch.cat([h, x], -1)  # the skip connection
        for layer in self.second:
            h = F.relu(layer(h))
        view = encode(dirs, self.view_bands).expand(*pts.shape[:-1], -1)
        return F.softplus(self.sigma(h)).squeeze(-1), torch.sigmoid(self.rgb(torch.cat([self.feature(h), view], -1)))


def render(field: FieldMLP, o: torch.Tensor, d: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Colour of each ray from samples at depths ``t`` (rays x samples); and the samples' weights."""
    pts = o[:, None] + d[:, None] * t[..., None]
    sigma, rgb = field(pts, d[:, None])
    delta = torch.cat([t[:, 1:] - t[:, :-1], torch.full_like(t[:, :1], 1e10)], -1)
    alpha = 1 - torch.exp(-sigma * delta)
    trans = torch.cumprod(torch.cat([torch.ones_like(alpha[:, :1]), 1 - alpha + 1e-10], -1), -1)[:, :-1]
    w = alpha * trans
    return (w[..., None] * rgb).sum(1), w


def sample_pdf(bins: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` depths per ray drawn from the piecewise-constant pdf of ``w`` over ``bins`` (inverse CDF)."""
    pdf = (w + 1e-5) / (w + 1e-5).sum(-1, keepdim=True)
    cdf = torch.cat([torch.zeros_like(pdf[:, :1]), pdf.cumsum(-1)], -1)
    u = torch.rand(w.shape[0], n)
    idx = torch.searchsorted(cdf, u, right=True).clamp(1, bins.shape[1] - 1)
    lo, hi = bins.gather(1, idx - 1), bins.gather(1, idx)
    c0, c1 = cdf.gather(1, idx - 1), cdf.gather(1, idx)
    return lo + (u - c0) / (c1 - c0).clamp_min(1e-5) * (hi - lo)


class NeRF(nn.Module):
    def __init__(self, width: int, coarse: int, fine: int) -> None:
        super().__init__()
        self.coarse, self.fine = FieldMLP(width), FieldMLP(width)
        self.n_coarse, self.n_fine = coarse, fine

    def forward(self, o: torch.Tensor, d: torch.Tensor, colour: torch.Tensor) -> torch.Tensor:
        t = torch.linspace(2.0, 4.0, self.n_coarse).expand(o.shape[0], -1)
        t = t + torch.rand_like(t) * (2.0 / self.n_coarse)  # stratified
        c_coarse, w = render(self.coarse, o, d, t)
        t_fine = torch.sort(torch.cat([t, sample_pdf(t, w.detach(), self.n_fine)], -1), -1).values
        c_fine, _ = render(self.fine, o, d, t_fine)
        return F.mse_loss(c_coarse, colour) + F.mse_loss(c_fine, colour)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--rays", type=int, default=64, help="rays per rank and step")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--coarse", type=int, default=32)
    p.add_argument("--fine", type=int, default=32)
    p.add_argument("--log-every", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = NeRF(args.width, args.coarse, args.fine)
    fully_shard(model.coarse)
    fully_shard(model.fine)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=5e-4)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.999)
    data = Rays(args.rays * world * 50)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.rays, sampler=sampler, num_workers=2, persistent_workers=True)
    stamps: list[float] = []  # each step's end: the loader's wait counts in the step after it
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for o, d, colour in loader:
            loss = model(o, d, colour)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            if step % args.log_every == 0:
                logged = loss.detach().clone()
                dist.all_reduce(logged)
                if rank == 0:
                    print(f"step {step} psnr {-10 * math.log10(logged.item() / world / 2):.2f}", flush=True)
            stamps.append(time.perf_counter())
            if step == args.steps:
                break
        epoch += 1
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][3:]
    if rank == 0 and gaps:
        print(f"median step {1000 * statistics.median(gaps):.1f} ms over {len(gaps)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
