"""A fresh user script for judging dagprof's DDP -> FSDP conversion on a family none of the kept pairs has: a temporal
convolutional network (TCN) that forecasts a multivariate series, as a user writes one.

Habits it exercises (not the mixer, ResNet, LoRA, recommender, transformer LM, GRU, depthwise convnet, Conformer, VAE or
translator the conversion was judged on):
- ``--depth`` residual blocks of two dilated causal ``Conv1d`` (left padding, dilation doubling per block), ``BatchNorm1d``
  (DDP broadcasts its buffers each forward), ``GELU`` and dropout, in ``model.tcn``; a 1x1 input projection and a linear
  head forecasting ``--horizon`` steps from the last position;
- ``--wrap fsdp``: ``fully_shard`` on every ``model.tcn[i]`` then the root; ``--wrap ddp``: ``DistributedDataParallel``;
- ``RMSprop`` with a ``OneCycleLR`` schedule, a Huber loss, ``clip_grad_value_``, ``zero_grad(set_to_none=False)``.

    dagprof profile -o runs/tcn-ddp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/tcn_forecast.py --wrap ddp
    dagprof whatif runs/tcn-ddp --data-parallel fsdp     # against: the same with --wrap fsdp
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class CausalBlock(nn.Module):
    def __init__(self, ch: int, dilation: int, kernel: int) -> None:
        super().__init__()
        self.pad = (kernel - 1) * dilation
        self.conv1 = nn.Conv1d(ch, ch, kernel, dilation=dilation)
        self.conv2 = nn.Conv1d(ch, ch, kernel, dilation=dilation)
        self.bn1, self.bn2 = nn.BatchNorm1d(ch), nn.BatchNorm1d(ch)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(F.gelu(self.bn1(self.conv1(F.pad(x, (self.pad, 0))))))
        h = self.drop(F.gelu(self.bn2(self.conv2(F.pad(h, (self.pad, 0))))))
        return x + h


class TCN(nn.Module):
    def __init__(self, series: int, ch: int, depth: int, kernel: int, horizon: int) -> None:
        super().__init__()
        self.inp = nn.Conv1d(series, ch, 1)
        self.tcn = nn.ModuleList(CausalBlock(ch, 2**k, kernel) for k in range(depth))
        self.head = nn.Linear(ch, series * horizon)
        self.series, self.horizon = series, horizon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for blk in self.tcn:
            h = blk(h)
        return self.head(h[:, :, -1]).view(-1, self.series, self.horizon)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--series", type=int, default=16)
    p.add_argument("--channels", type=int, default=48)
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--kernel", type=int, default=3)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--horizon", type=int, default=24)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = TCN(args.series, args.channels, args.depth, args.kernel, args.horizon)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in model.tcn:
            fully_shard(blk)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.steps)
    gen = torch.Generator().manual_seed(dist.get_rank())
    t = torch.arange(args.window + args.horizon, dtype=torch.float32)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        phase = torch.rand(args.batch, args.series, 1, generator=gen) * 6.28
        series = torch.sin(t / 12.0 + phase) + 0.1 * torch.randn(args.batch, args.series, t.numel(), generator=gen)
        x, y = series[:, :, :args.window], series[:, :, args.window:]
        loss = F.huber_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=False)
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
