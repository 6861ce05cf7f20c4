"""A fresh FSDP2 user script for reviewing dagprof (issue 16): a small Mamba-style selective state-space language model.

Habits it exercises, as users write them (none of the other fresh scripts has them together):
- each block: a gated input projection, a causal depthwise ``Conv1d``, a selective scan (input-dependent step ``dt``,
  ``B``, ``C``) written as a Python loop over the sequence, an output projection; RMSNorm written by hand;
- ``fully_shard(block, reshard_after_forward=--reshard-to)`` (an int: 2 of 4 ranks keep half the parameters after forward),
  the embedding and head in the root with ``reshard_after_forward=False``; ``--reshard-to 0`` gives ``True``;
- ``torch.autocast("cpu", dtype=torch.bfloat16)`` around the forward (no ``MixedPrecisionPolicy``);
- ``Adam(fused=False, foreach=False)``, ``ExponentialLR``, ``clip_grad_value_``.

    dagprof profile -o runs/ssm -- torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/ssm_reshard.py --steps 10
    torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/ssm_reshard.py --memory /tmp/ssm-mem   # each step's peak per rank
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

VOCAB, DIM, STATE, SEQ, BATCH = 512, 64, 8, 24, 4


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class MambaBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        inner = 2 * d
        self.norm = RMSNorm(d)
        self.in_proj = nn.Linear(d, 2 * inner, bias=False)
        self.conv = nn.Conv1d(inner, inner, 4, groups=inner, padding=3)
        self.x_proj = nn.Linear(inner, 1 + 2 * STATE, bias=False)
        self.dt_proj = nn.Linear(1, inner)
        self.a_log = nn.Parameter(torch.log(torch.arange(1, STATE + 1).float()).repeat(inner, 1))
        self.out_proj = nn.Linear(inner, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, gate = self.in_proj(self.norm(x)).chunk(2, dim=-1)
        u = F.silu(self.conv(u.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2))
        dt, b, c = self.x_proj(u).split([1, STATE, STATE], dim=-1)
        dt = F.softplus(self.dt_proj(dt))                       # (B, L, inner)
        a = -torch.exp(self.a_log.float())                       # (inner, STATE)
        h = u.new_zeros(u.shape[0], u.shape[2], STATE)
        ys = []
        for t in range(u.shape[1]):
            h = torch.exp(dt[:, t, :, None] * a) * h + dt[:, t, :, None] * b[:, t, None, :] * u[:, t, :, None]
            ys.append((h * c[:, t, None, :]).sum(-1))
        y = torch.stack(ys, dim=1) * F.silu(gate)
        return x + self.out_proj(y)


class MambaLM(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(MambaBlock(DIM) for _ in range(layers))
        self.norm = RMSNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        x = self.embed(tok)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--reshard-to", type=int, default=2, help="reshard_after_forward=N on each block (0: True)")
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = MambaLM(args.layers)
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=args.reshard_to or True)
    fully_shard(model, reshard_after_forward=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.98)
    g = torch.Generator().manual_seed(dist.get_rank())
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    for step in range(args.steps):
        with peaks.step():
            tok = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(tok[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tok[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
            opt.step()
            sched.step()
            opt.zero_grad()
        if dist.get_rank() == 0 and step % 3 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    peaks.save(dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
