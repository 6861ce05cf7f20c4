"""A fresh user script for judging dagprof's DDP -> FSDP conversion on a model family none of the kept pairs has: a small
decoder-only transformer language model trained from scratch, as a user writes one.

Habits it exercises (not the mixer, ResNet, LoRA or recommender the conversion was judged on):
- token and learned position embeddings, pre-norm decoder layers of ``nn.MultiheadAttention`` under a causal mask and a
  GELU MLP, a final norm and an untied ``lm_head``;
- ``--wrap fsdp``: ``fully_shard`` on every ``model.layers[i]`` then the root; ``--wrap ddp``: ``DistributedDataParallel``;
- ``AdamW`` with weight decay on the matrices only (two parameter groups), a linear warm-up by ``LambdaLR``,
  ``clip_grad_norm_``, next-token cross-entropy on random token streams.

    dagprof profile -o runs/lm-ddp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/tiny_lm.py --wrap ddp
    dagprof whatif runs/lm-ddp --data-parallel fsdp     # against: the same with --wrap fsdp
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, depth: int, heads: int, context: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.layers = nn.ModuleList(DecoderLayer(dim, heads) for _ in range(depth))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t))
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        for layer in self.layers:
            x = layer(x, mask)
        return self.lm_head(self.ln_f(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.dim, args.depth, 4, args.context)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    rest = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        ids = torch.randint(0, args.vocab, (args.batch, args.context + 1), generator=gen)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
