"""A fresh DDP user script for reviewing dagprof: a RealNVP normalizing flow whose gradients go on the wire as int8, by a
comm hook the user wrote.

Habits it exercises, as users write them:
- ``register_comm_hook(state, int8_hook)``: per bucket, the gradients' largest magnitude is agreed on with a blocking
  ``all_reduce(MAX)`` of one float, the bucket is rounded to int8 levels that cannot overflow when the ranks' sum
  (127 // world of them a side), all-reduced with ``async_op=True``, and turned back into the average in the future's
  callback: a quarter of DDP's bytes on the wire;
- a RealNVP flow (affine coupling layers with alternating masks, MLP scale and shift nets, tanh-bounded scales) fitted by
  maximum likelihood to a synthetic 64-dimensional Gaussian mixture, Adam, ``clip_grad_norm_``, ``bucket_cap_mb=2``.

Without a profiler it prints its median step from step 5 on (``zero1_measure.py --script`` reads it).

    dagprof profile -o runs/int8 -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/int8_hook_flow.py --steps 12
"""
import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def int8_hook(group: dist.ProcessGroup, bucket):  # DDP refuses a "bucket" annotation other than its own GradBucket class
    grad = bucket.buffer()
    world = group.size()
    scale = grad.abs().max().reshape(1)
    dist.all_reduce(scale, op=dist.ReduceOp.MAX, group=group)  # every rank rounds on the same grid
    levels = 127 // world
    step = scale.clamp_min(1e-12) / levels
    q = torch.round(grad / step).clamp_(-levels, levels).to(torch.int8)
    fut = dist.all_reduce(q, group=group, async_op=True).get_future()

    def back(f: torch.futures.Future) -> torch.Tensor:
        grad.copy_(f.value()[0].to(grad.dtype) * (step / world))
        return grad

    return fut.then(back)


class Coupling(nn.Module):
    def __init__(self, dim: int, hidden: int, flip: bool) -> None:
        super().__init__()
        self.flip = flip
        half = dim // 2
        self.net = nn.Sequential(nn.Linear(half, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2 * half))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = x.chunk(2, dim=1)
        if self.flip:
            a, b = b, a
        s, t = self.net(a).chunk(2, dim=1)
        s = torch.tanh(s)
        b = b * s.exp() + t
        out = torch.cat([b, a] if self.flip else [a, b], dim=1)
        return out, s.sum(dim=1)


class RealNVP(nn.Module):
    def __init__(self, dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Coupling(dim, hidden, k % 2 == 1) for k in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The negative log-likelihood of ``x`` per sample (nats)."""
        log_det = torch.zeros(x.shape[0])
        for layer in self.layers:
            x, ld = layer(x)
            log_det = log_det + ld
        return (0.5 * (x ** 2).sum(dim=1) + 0.5 * x.shape[1] * math.log(2 * math.pi) - log_det).mean()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=512, help="the coupling nets' width (512: 2.5 M parameters, 10 MB of fp32 gradients)")
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    centres = 3 * torch.randn(4, args.dim)
    mix = torch.randn(args.dim, args.dim) / math.sqrt(args.dim)
    model = DDP(RealNVP(args.dim, args.hidden, args.layers), bucket_cap_mb=2)
    model.register_comm_hook(dist.group.WORLD, int8_hook)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        pick = torch.randint(0, len(centres), (args.batch,), generator=gen)
        x = centres[pick] + torch.randn(args.batch, args.dim, generator=gen) @ mix
        loss = model(x)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[5:])
        print(f"int8_hook_flow: {args.steps} steps, nll {loss.item():.2f}, median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
