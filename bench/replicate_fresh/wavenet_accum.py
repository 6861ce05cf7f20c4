"""A fresh user-style job under the composable ``replicate()`` (issue 16): a WaveNet on synthetic audio.

Habits, as users write them (no other fresh script has this family or these habits together):
- a WaveNet (van den Oord et al. 2016): a causal 1-d conv stem, stacks of dilated causal convs (dilations 1..2^k, twice)
  with gated tanh x sigmoid units, residual and skip 1x1 convs, a head over 256 mu-law classes;
- data parallelism by ``torch.distributed._composable.replicate`` (torchtitan's DDP path), with torch's fp16 compression
  registered on the module (``model.register_comm_hook(None, fp16_compress_hook)``, which replicate() hands its DDP);
- torchtitan's accumulation: ``model.set_requires_gradient_sync(False)`` for all but the last micro-batch of a step;
- ``torch.optim.Adam`` with an exponential LR decay stepped every step.

    dagprof profile -o runs/wavenet -- torchrun --standalone --nproc-per-node 2 bench/replicate_fresh/wavenet_accum.py --steps 12
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed._composable import replicate
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel as DDP


class CausalConv(nn.Conv1d):
    def __init__(self, cin: int, cout: int, k: int, dilation: int = 1):
        super().__init__(cin, cout, k, dilation=dilation)
        self.pad = (k - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.pad, 0)))


class ResBlock(nn.Module):
    def __init__(self, ch: int, skip: int, dilation: int, last: bool = False):
        super().__init__()
        self.filt = CausalConv(ch, ch, 2, dilation)
        self.gate = CausalConv(ch, ch, 2, dilation)
        self.res = None if last else nn.Conv1d(ch, ch, 1)  # the last block's residual feeds nothing (DDP: an unused parameter)
        self.skip = nn.Conv1d(ch, skip, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.tanh(self.filt(x)) * torch.sigmoid(self.gate(x))
        return (x if self.res is None else x + self.res(z)), self.skip(z)


class WaveNet(nn.Module):
    def __init__(self, classes: int = 256, ch: int = 32, skip: int = 64, layers: int = 6, stacks: int = 2):
        super().__init__()
        self.embed = nn.Embedding(classes, ch)
        self.stem = CausalConv(ch, ch, 2)
        n = stacks * layers
        self.blocks = nn.ModuleList(ResBlock(ch, skip, 2 ** (k % layers), last=k == n - 1) for k in range(n))
        self.out1 = nn.Conv1d(skip, skip, 1)
        self.out2 = nn.Conv1d(skip, classes, 1)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        x = self.stem(self.embed(q).transpose(1, 2))
        skips = 0
        for b in self.blocks:
            x, s = b(x)
            skips = skips + s
        return self.out2(F.relu(self.out1(F.relu(skips))))


def mu_law(x: torch.Tensor, classes: int = 256) -> torch.Tensor:
    mu = classes - 1
    y = torch.sign(x) * torch.log1p(mu * x.abs()) / torch.log1p(torch.tensor(float(mu)))
    return ((y + 1) / 2 * mu + 0.5).long().clamp(0, mu)


def batch(n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    t = torch.arange(length + 1).float() / 16000
    f = 100 + 900 * torch.rand(n, 3, 1, generator=gen)
    wave = (torch.sin(2 * torch.pi * f * t) * torch.rand(n, 3, 1, generator=gen)).sum(1) / 3
    return mu_law(wave + 0.01 * torch.randn(n, length + 1, generator=gen))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4, help="clips per micro-batch")
    ap.add_argument("--length", type=int, default=1024, help="samples per clip")
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    ap.add_argument("--ddp", action="store_true", help="the same job under DistributedDataParallel (the bench's control)")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = net = WaveNet()
    if a.ddp:
        model = DDP(net)
        model.register_comm_hook(None, fp16_compress_hook)
    else:
        replicate(model)
        model.register_comm_hook(None, fp16_compress_hook)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.999)
    gen = torch.Generator().manual_seed(1234 + rank)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        for micro in range(a.accum):
            q = batch(a.batch, a.length, gen)
            sync = micro == a.accum - 1
            if a.ddp:
                ctx = contextlib.nullcontext() if sync else model.no_sync()
            else:
                model.set_requires_gradient_sync(sync)
                ctx = contextlib.nullcontext()
            with ctx:
                logits = model(q[:, :-1])
                loss = F.cross_entropy(logits, q[:, 1:]) / a.accum
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"wavenet: loss {loss.item() * a.accum:.3f}, median step {statistics.median(times[3:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
