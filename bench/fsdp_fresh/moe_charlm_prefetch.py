"""A fresh FSDP2 user script for reviewing dagprof (stop 66): a character-level mixture-of-experts LM, routed by hand.

Habits it exercises, as users write them from the FSDP2 tutorial (no other fresh script has them together):
- pre-norm decoder blocks (``F.scaled_dot_product_attention(is_causal=True)``, rotary-free learned positions) whose MLP
  is a top-2 mixture of ``--experts`` GELU experts held as an ``nn.ModuleList``: the router's top-2 weights renormalised,
  tokens picked per expert by ``torch.where`` and their outputs added back with ``index_add_`` (no all-to-all: every rank
  holds every expert), a router z-loss and the Switch balance loss;
- ``fully_shard`` on each block, then on the root with ``reshard_after_forward=False`` (the root only: the tied
  embedding / output layer stays gathered from the forward into the backward);
- explicit prefetching as the tutorial shows it: ``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``
  on each block naming its neighbour;
- ``NAdam`` with decoupled weight decay, ``PolynomialLR``, a Markov-chain character corpus sampled per rank;
  the loss all-reduced (averaged) for the log line every ``--log-every`` steps.
Without a profiler it prints its median step from step 4 on.

    dagprof profile -o runs/moechar -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/moe_charlm_prefetch.py
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


class Experts(nn.Module):
    def __init__(self, dim: int, experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
                                     for _ in range(experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.reshape(-1, x.shape[-1])
        logits = self.router(flat)
        probs = logits.softmax(-1)
        w, idx = probs.topk(2, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(idx == e)  # run even on no tokens: FSDP2 reduce-scatters only gradients that exist
            out.index_add_(0, tok, expert(flat[tok]) * w[tok, slot, None])
        load = F.one_hot(idx[:, 0], len(self.experts)).float().mean(0)
        aux = len(self.experts) * (load * probs.mean(0)).sum() + 1e-3 * torch.logsumexp(logits, -1).pow(2).mean()
        return out.view_as(x), aux


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, experts: int) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.moe = Experts(dim, experts)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        m, aux = self.moe(self.n2(x))
        return x + m, aux


class CharMoE(nn.Module):
    def __init__(self, vocab: int, ctx: int, dim: int, heads: int, depth: int, experts: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Parameter(torch.zeros(ctx, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, experts) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, aux = self.tok(ids) + self.pos[:ids.shape[1]], 0
        for blk in self.blocks:
            x, a = blk(x)
            aux = aux + a
        return self.head(self.norm(x)), aux


def corpus(vocab: int, batch: int, ctx: int, g: torch.Generator) -> torch.Tensor:
    """A batch of sequences from a fixed sparse Markov chain over characters (the same chain on every rank)."""
    trans = torch.rand(vocab, vocab, generator=torch.Generator().manual_seed(5)).pow(8)
    trans = trans / trans.sum(-1, keepdim=True)
    seq = [torch.randint(vocab, (batch,), generator=g)]
    for _ in range(ctx):
        seq.append(torch.multinomial(trans[seq[-1]], 1, generator=g).squeeze(-1))
    return torch.stack(seq, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--ctx", type=int, default=48)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--log-every", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    vocab = 96
    model = CharMoE(vocab, args.ctx, args.dim, args.heads, args.depth, args.experts)
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model, reshard_after_forward=False)
    blocks = list(model.blocks)
    for i, blk in enumerate(blocks):
        if i + 1 < len(blocks):
            blk.set_modules_to_forward_prefetch([blocks[i + 1]])
        if i > 0:
            blk.set_modules_to_backward_prefetch([blocks[i - 1]])
    opt = torch.optim.NAdam(model.parameters(), lr=2e-3, weight_decay=0.01, decoupled_weight_decay=True)
    sched = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=args.steps, power=1.0)
    g = torch.Generator().manual_seed(40 + rank)
    stamps: list[float] = []
    for step in range(1, args.steps + 1):
        seq = corpus(vocab, args.batch, args.ctx, g)
        logits, aux = model(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), seq[:, 1:].reshape(-1)) + 0.01 * aux
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        if step % args.log_every == 0:
            avg = loss.detach().clone()
            dist.all_reduce(avg, op=dist.ReduceOp.SUM)
            if rank == 0:
                print(f"step {step} loss {avg.item() / world:.3f}", flush=True)
        stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][3:]
    if rank == 0 and gaps:
        print(f"median step {1000 * statistics.median(gaps):.1f} ms over {len(gaps)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
