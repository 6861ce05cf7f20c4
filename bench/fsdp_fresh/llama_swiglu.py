"""A fresh FSDP2 user script for reviewing dagprof (issues 16 and 20, stop 59): a small Llama-style decoder, 2 ranks.

Habits it exercises, as users write them (no other fresh script has them together):
- a Llama block: RMSNorm, rotary position embeddings (complex ``torch.polar`` frequencies, ``view_as_complex``),
  grouped-query attention (8 query heads over 2 key/value heads, ``repeat_interleave``), a SwiGLU MLP, no biases;
- ``fully_shard`` on each block and on the root with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``;
- activation checkpointing of each block by the composable ``torch.distributed._composable.checkpoint`` (applied
  before ``fully_shard``, as torchtitan orders them; ``--no-ckpt`` without);
- AdamW with two parameter groups (weight decay on matrices only, none on norms and embeddings), a linear warm-up then
  cosine decay by ``LambdaLR``, ``clip_grad_norm_`` (the returned norm is a DTensor: ``.full_tensor()`` for logging);
- token batches from one ``torch.randint`` corpus, next-token loss with ``ignore_index`` padding.

    dagprof profile -o runs/llama -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/llama_swiglu.py --steps 14
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


def rope_freqs(head_dim: int, seq: int, theta: float = 10000.0) -> torch.Tensor:
    f = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    return torch.polar(torch.ones(seq, head_dim // 2), torch.outer(torch.arange(seq).float(), f))


def rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs[: x.shape[1], None, :]).flatten(3).type_as(x)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wkv = nn.Linear(dim, 2 * kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.attn_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.attn_norm(x)
        q = rope(self.wq(h).view(b, s, self.heads, self.hd), freqs)
        k, v = self.wkv(h).view(b, s, 2, self.kv_heads, self.hd).unbind(2)
        k = rope(k, freqs)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, d))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, vocab: int = 4096, dim: int = 256, layers: int = 4, heads: int = 8, kv_heads: int = 2, seq: int = 128) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, kv_heads, 688) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("freqs", rope_freqs(dim // heads, seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        for layer in self.layers:
            x = layer(x, self.freqs)
        return self.out(self.norm(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--no-ckpt", action="store_true", help="no activation checkpointing")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Llama(seq=args.seq)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        if not args.no_ckpt:
            checkpoint(layer)
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    decay = [p_ for n, p_ in model.named_parameters() if p_.dim() >= 2 and "tok" not in n]
    no_decay = [p_ for n, p_ in model.named_parameters() if p_.dim() < 2 or "tok" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return (step + 1) / args.warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, args.steps - args.warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    g = torch.Generator().manual_seed(1234 + rank)
    corpus = torch.randint(1, 4096, (args.steps * args.batch, args.seq + 1), generator=g)
    corpus[:, -8:] = 0  # padded ends, ignored by the loss
    for step in range(args.steps):
        batch = corpus[step * args.batch:(step + 1) * args.batch]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten(), ignore_index=0)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if rank == 0 and step % 4 == 0:
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            print(f"step {step} loss {loss.item():.3f} grad-norm {norm.item():.2f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
