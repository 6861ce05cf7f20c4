"""A fresh FSDP2 user script for reviewing dagprof (issue 16): a GPT-style decoder with tied embeddings, on 2 ranks.

Habits it exercises, as users write them (none of the other fresh scripts has them together):
- a decoder-only language model whose output head reuses the input embedding's weight (``lm_head.weight = wte.weight``):
  one parameter used twice, both uses inside the root unit;
- ``fully_shard`` per block with ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``, then on the root;
- activation checkpointing written inside the block (``torch.utils.checkpoint.checkpoint(self._body, x,
  use_reentrant=False)`` in ``Block.forward``), causal attention by ``F.scaled_dot_product_attention(is_causal=True)``;
- ``AdamW`` with parameter groups (no weight decay on norms, biases and the embedding), a warm-up ``LambdaLR``,
  ``clip_grad_norm_`` on the DTensor gradients, ``zero_grad(set_to_none=True)``; the loss logged every 5 steps.

    dagprof profile -o runs/gpt -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/gpt_tied_ckpt.py --steps 20
    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/gpt_tied_ckpt.py --memory /tmp/gpt-mem   # each step's peak per rank
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

VOCAB, CTX, DIM, HEADS = 2048, 64, 128, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc, self.out = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(DIM, dim=-1)
        q, k, v = (z.view(b, t, HEADS, DIM // HEADS).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.proj(att)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self._body, x, use_reentrant=False) if self.training else self._body(x)


class GPT(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(CTX, DIM)
        self.h = nn.ModuleList(Block() for _ in range(depth))
        self.ln_f = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight          # tied
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--keep-gathered", action="store_true", help="reshard_after_forward=False on every block (what optimize picks)")
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234)
    model = GPT(args.depth)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.h:
        fully_shard(block, mp_policy=mp, reshard_after_forward=not args.keep_gathered)
    fully_shard(model, mp_policy=mp)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "wte" not in n and "wpe" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "wte" not in n and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95))
    warmup = 5
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / 100))))
    g = torch.Generator().manual_seed(rank)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    model.train()
    for step in range(args.steps):
        idx = torch.randint(0, VOCAB, (args.batch, CTX + 1), generator=g)
        with peaks.step():
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), idx[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            last = loss.item()
            if args.memory:  # the heap's level as the next step starts would hold these 2 MiB of logits, freed before its peak
                del logits, loss
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {last:.3f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
    peaks.save(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
