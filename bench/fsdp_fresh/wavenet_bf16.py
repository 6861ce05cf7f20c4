"""A fresh FSDP2 user script for reviewing dagprof (issue 16): a small WaveNet (dilated causal convolutions) on audio.

Habits it exercises, as users write them (no other fresh script has this model family):
- residual blocks of a gated dilated causal ``Conv1d`` (tanh * sigmoid) with 1x1 residual and skip convolutions;
  the dilations cycle 1, 2, 4, 8; a mu-law 256-way softmax output over the next sample;
- ``fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))``
  per residual block, then the root (input embedding, skip head) with the same policy;
- ``AdamW`` with ``OneCycleLR``, ``clip_grad_norm_`` on the DTensor gradients (its total norm printed),
  ``zero_grad(set_to_none=True)``.

    dagprof profile -o runs/wavenet -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/wavenet_bf16.py --steps 12
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

CLASSES, RES, SKIP, SAMPLES, BATCH = 256, 48, 96, 400, 4


class ResidualBlock(nn.Module):
    def __init__(self, dilation: int) -> None:
        super().__init__()
        self.dilation = dilation
        self.conv = nn.Conv1d(RES, 2 * RES, kernel_size=2, dilation=dilation)
        self.res = nn.Conv1d(RES, RES, 1)
        self.skip = nn.Conv1d(RES, SKIP, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.conv(F.pad(x, (self.dilation, 0)))          # causal: pad on the left only
        filt, gate = h.chunk(2, dim=1)
        z = torch.tanh(filt) * torch.sigmoid(gate)
        return x + self.res(z), self.skip(z)


class WaveNet(nn.Module):
    def __init__(self, stacks: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(CLASSES, RES)
        self.blocks = nn.ModuleList(ResidualBlock(2 ** (i % 4)) for i in range(4 * stacks))
        self.head = nn.Sequential(nn.ReLU(), nn.Conv1d(SKIP, SKIP, 1), nn.ReLU(), nn.Conv1d(SKIP, CLASSES, 1))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        x = self.embed(q).transpose(1, 2)
        skips = 0
        for block in self.blocks:
            x, s = block(x)
            skips = skips + s
        return self.head(skips)


def mu_law(wave: torch.Tensor) -> torch.Tensor:
    mu = CLASSES - 1
    y = torch.sign(wave) * torch.log1p(mu * wave.abs()) / torch.log1p(torch.tensor(float(mu)))
    return ((y + 1) / 2 * mu + 0.5).long().clamp(0, mu)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--stacks", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = WaveNet(args.stacks)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    t = torch.arange(SAMPLES + 1).float()
    for step in range(args.steps):
        freq = torch.rand(BATCH, 1, generator=g) * 0.2 + 0.01
        wave = 0.6 * torch.sin(freq * t) + 0.05 * torch.randn(BATCH, SAMPLES + 1, generator=g)
        q = mu_law(wave.clamp(-1, 1))
        logits = model(q[:, :-1])
        loss = F.cross_entropy(logits.float(), q[:, 1:])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if dist.get_rank() == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.3f} grad norm {norm.full_tensor().item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
