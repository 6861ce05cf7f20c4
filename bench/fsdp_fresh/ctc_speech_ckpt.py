"""A fresh FSDP2 user script for reviewing dagprof: a small speech recogniser (conv front end + transformer encoder, CTC).

Habits it exercises, as users write them (none of the other fresh FSDP scripts has them together):
- an audio model: a strided ``Conv1d`` feature extractor over raw waveforms, a transformer encoder, a CTC head with
  ``F.ctc_loss`` on targets of random lengths;
- ``fully_shard`` on the front end and on each encoder block, then the root, all with
  ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``;
- activation checkpointing written by hand: ``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`` in the
  model's forward;
- ``AdamW``, a linear warm-up with ``LambdaLR``, ``clip_grad_norm_`` on the DTensor gradients.

    dagprof profile -o runs/ctc -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/ctc_speech_ckpt.py --steps 10
    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/ctc_speech_ckpt.py --steps 4 --memory /tmp/ctc-mem   # each step's peak per rank
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

CHARS = 30  # 0 is CTC's blank


class FrontEnd(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.convs = nn.Sequential(nn.Conv1d(1, d, 10, stride=5), nn.GELU(), nn.Conv1d(d, d, 8, stride=4), nn.GELU(),
                                   nn.Conv1d(d, d, 4, stride=2), nn.GELU())
        self.proj = nn.Linear(d, d)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        return self.proj(self.convs(wav[:, None, :]).transpose(1, 2))


class Block(nn.Module):
    def __init__(self, d: int, heads: int = 4) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class Recogniser(nn.Module):
    def __init__(self, d: int = 128, layers: int = 4) -> None:
        super().__init__()
        self.front = FrontEnd(d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, CHARS)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        x = self.front(wav)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x).log_softmax(-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=1.0, help="audio per utterance at 16 kHz")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Recogniser(args.width)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(model.front, mp_policy=mp)
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    gen = torch.Generator().manual_seed(rank)
    samples = int(16000 * args.seconds)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    for _step in range(args.steps):
        with peaks.step():
            loss = train_step(model, opt, sched, gen, args.batch, samples)
    peaks.save(rank)
    if rank == 0:
        print(f"ctc_speech_ckpt: {args.steps} steps, loss {loss:.3f}")
    dist.destroy_process_group()


def train_step(model: nn.Module, opt: torch.optim.Optimizer, sched, gen: torch.Generator, batch: int, samples: int) -> float:
    wav = torch.randn(batch, samples, generator=gen)
    target_len = torch.randint(5, 15, (batch,), generator=gen)
    targets = torch.randint(1, CHARS, (int(target_len.sum()),), generator=gen)
    logp = model(wav)  # (batch, frames, chars), bf16
    frames = torch.full((batch,), logp.shape[1], dtype=torch.long)
    loss = F.ctc_loss(logp.float().transpose(0, 1), targets, frames, target_len, zero_infinity=True)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    opt.step()
    sched.step()
    return loss.item()


if __name__ == "__main__":
    main()
