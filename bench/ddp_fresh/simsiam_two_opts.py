"""A fresh DDP user script for reviewing dagprof (stop 66): SimSiam self-supervised pre-training on 1-D sensor signals.

Habits it exercises, as users write them (no other fresh script has them together):
- SimSiam: a residual ``Conv1d`` encoder with ``BatchNorm1d``, a projection MLP and a predictor MLP; two augmented views
  (random crop-and-resize by ``F.interpolate``, jitter, channel scaling) per signal, the symmetric negative cosine loss
  with a stop-gradient (``z.detach()``);
- two optimizers stepped at different rates: ``SGD(momentum=0.9)`` on the encoder and projector every step, ``Adam``
  on the predictor every ``--pred-every`` (2) steps, its gradients accumulating in between (each optimizer zeroes only
  its own parameters' gradients, after its own step);
- ``DistributedDataParallel(gradient_as_bucket_view=True, broadcast_buffers=False)`` (each rank keeps its BatchNorm
  statistics); ``CosineAnnealingWarmRestarts`` on the encoder's optimizer;
- a kNN-free monitor: the per-dimension std of the normalised embeddings (collapse check), all-reduced every
  ``--log-every`` steps.
Without a profiler it prints its median step from step 4 on.

    dagprof profile -o runs/simsiam -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/simsiam_two_opts.py
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def signals(batch: int, channels: int, length: int, g: torch.Generator) -> torch.Tensor:
    """Noisy mixtures of a few random sinusoids per channel (accelerometer-like)."""
    t = torch.linspace(0, 1, length)
    freq = torch.randint(1, 12, (batch, channels, 3), generator=g).float()
    phase = 6.283 * torch.rand(batch, channels, 3, generator=g)
    return torch.sin(6.283 * freq[..., None] * t + phase[..., None]).sum(2) + 0.2 * torch.randn(batch, channels, length, generator=g)


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    n, c, length = x.shape
    crop = int(length * (0.6 + 0.4 * torch.rand(1, generator=g).item()))
    start = int(torch.randint(length - crop + 1, (1,), generator=g))
    x = F.interpolate(x[..., start:start + crop], size=length, mode="linear", align_corners=False)
    return x * (0.8 + 0.4 * torch.rand(n, c, 1, generator=g)) + 0.05 * torch.randn(x.shape, generator=g)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv1d(cin, cout, 7, stride, 3, bias=False), nn.BatchNorm1d(cout)
        self.c2, self.b2 = nn.Conv1d(cout, cout, 7, 1, 3, bias=False), nn.BatchNorm1d(cout)
        self.skip = nn.Sequential(nn.Conv1d(cin, cout, 1, stride, bias=False), nn.BatchNorm1d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.skip(x))


class SimSiam(nn.Module):
    def __init__(self, channels: int, width: int, dim: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(ResBlock(channels, width, 2), ResBlock(width, 2 * width, 2), ResBlock(2 * width, 4 * width, 2),
                                     nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.projector = nn.Sequential(nn.Linear(4 * width, dim, bias=False), nn.BatchNorm1d(dim), nn.ReLU(),
                                       nn.Linear(dim, dim, bias=False), nn.BatchNorm1d(dim, affine=False))
        self.predictor = nn.Sequential(nn.Linear(dim, dim // 4, bias=False), nn.BatchNorm1d(dim // 4), nn.ReLU(), nn.Linear(dim // 4, dim))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        z1, z2 = self.projector(self.encoder(a)), self.projector(self.encoder(b))
        return self.predictor(z1), self.predictor(z2), z1.detach(), z2.detach()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--pred-every", type=int, default=2)
    p.add_argument("--log-every", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = SimSiam(6, args.width, args.dim)
    model = DDP(net, gradient_as_bucket_view=True, broadcast_buffers=False)
    backbone = [*net.encoder.parameters(), *net.projector.parameters()]
    opt_enc = torch.optim.SGD(backbone, lr=0.05 * args.batch * world / 256, momentum=0.9, weight_decay=1e-4)
    opt_pred = torch.optim.Adam(net.predictor.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt_enc, T_0=8)
    g = torch.Generator().manual_seed(70 + rank)
    stamps: list[float] = []
    for step in range(1, args.steps + 1):
        x = signals(args.batch, 6, args.length, g)
        p1, p2, z1, z2 = model(augment(x, g), augment(x, g))
        loss = -(F.cosine_similarity(p1, z2).mean() + F.cosine_similarity(p2, z1).mean()) / 2
        loss.backward()
        opt_enc.step()
        opt_enc.zero_grad()
        sched.step()
        if step % args.pred_every == 0:
            opt_pred.step()
            opt_pred.zero_grad()
        if step % args.log_every == 0:
            spread = torch.stack([F.normalize(z1, dim=1).std(0).mean(), loss.detach()])
            dist.all_reduce(spread)
            if rank == 0:
                print(f"step {step} loss {spread[1].item() / world:.3f} z-std {spread[0].item() / world:.4f}", flush=True)
        stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][3:]
    if rank == 0 and gaps:
        print(f"median step {1000 * statistics.median(gaps):.1f} ms over {len(gaps)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
