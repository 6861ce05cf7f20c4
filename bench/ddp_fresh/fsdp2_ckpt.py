"""A fresh FSDP2 user script for reviewing dagprof: activation checkpointing inside blocks, the last block kept gathered.

Habits it exercises, as users write them:
- ``fully_shard`` on each block, then on the root; ``reshard_after_forward=False`` on the last block only (its
  parameters stay gathered for backward, the others are gathered again);
- ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` inside each block's forward (backward recomputes);
- ``AdamW`` with two parameter groups: weight decay on matrices, none on biases and norms.

    dagprof profile -o runs/ckpt -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/fsdp2_ckpt.py --steps 20
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self._inner, x, use_reentrant=False)


class Encoder(nn.Module):
    def __init__(self, vocab: int = 1000, d: int = 192, depth: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Encoder()
    for i, block in enumerate(model.blocks):
        fully_shard(block, reshard_after_forward=i < len(model.blocks) - 1)
    fully_shard(model)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=3e-4)
    torch.manual_seed(dist.get_rank())
    for _ in range(args.steps):
        tokens = torch.randint(0, 1000, (args.batch, args.seq))
        loss = F.cross_entropy(model(tokens).flatten(0, 1), torch.roll(tokens, -1, 1).flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    if dist.get_rank() == 0:
        print(f"fsdp2_ckpt: {args.steps} steps, loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
