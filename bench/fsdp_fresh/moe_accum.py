"""A fresh FSDP2 job (issue 16 review): a mixture-of-experts transformer, sharded experts, accumulation as torchtitan does it.

Habits it exercises, as users write them (no other fresh FSDP script has this family or these habits together):
- decoder blocks whose MLP is a top-2 mixture of ``--experts`` SwiGLU experts (a softmax router, tokens dispatched per
  expert by ``index_select`` / ``index_add_``, the Switch load-balancing auxiliary loss), every rank holding every
  expert (no expert parallelism);
- ``fully_shard(block.moe.experts, shard_placement_fn=...)`` on each block's experts (the stacked expert weights sharded
  on their expert dimension's neighbour, dim 1, the others on dim 0), then ``fully_shard(block)``, then the root;
- gradient accumulation as torchtitan writes it: on every micro-batch but the last, ``set_requires_gradient_sync(False)``
  and ``set_reshard_after_backward(False)`` (the parameters stay gathered between micro-batches), both turned back on
  for the last one; ``--accum`` micro-batches (2);
- ``AdamW(foreach=True)`` with a cosine schedule, ``clip_grad_norm_`` on the DTensor gradients;
- ``--wrap root``: ``fully_shard`` on the root only (one unit), what ``dagprof whatif --units merge:all`` predicts.

    dagprof profile -o runs/moe -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/moe_accum.py --steps 20
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard

DIM, HEADS, VOCAB, SEQ = 128, 4, 2048, 64


class Experts(nn.Module):
    """``n`` SwiGLU experts as stacked weights (one parameter per projection, as MoE libraries keep them)."""

    def __init__(self, n: int, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(n, dim, hidden) / math.sqrt(dim))
        self.w3 = nn.Parameter(torch.randn(n, dim, hidden) / math.sqrt(dim))
        self.w2 = nn.Parameter(torch.randn(n, hidden, dim) / math.sqrt(hidden))

    def forward(self, x: torch.Tensor, e: int) -> torch.Tensor:
        return (F.silu(x @ self.w1[e]) * (x @ self.w3[e])) @ self.w2[e]


class MoE(nn.Module):
    def __init__(self, dim: int, n: int, top_k: int = 2):
        super().__init__()
        self.n, self.top_k = n, top_k
        self.router = nn.Linear(dim, n, bias=False)
        self.experts = Experts(n, dim, 2 * dim)
        self.aux = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        probs = self.router(flat).softmax(-1)
        weight, chosen = probs.topk(self.top_k, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e in range(self.n):
            tok, slot = (chosen == e).nonzero(as_tuple=True)
            if tok.numel():
                y = self.experts(flat.index_select(0, tok), e) * weight[tok, slot].unsqueeze(-1)
                out = out.index_add(0, tok, y)
        load = F.one_hot(chosen[:, 0], self.n).float().mean(0)
        self.aux = self.n * (load * probs.mean(0)).sum()
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self, experts: int):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.o = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.moe = MoE(DIM, experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.o(a)
        return x + self.moe(self.n2(x))


class MoELM(nn.Module):
    def __init__(self, layers: int, experts: int):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(experts) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(ids)
        for blk in self.blocks:
            x = blk(x)
        aux = sum(blk.moe.aux for blk in self.blocks)
        return self.head(self.norm(x)), aux


def expert_dim1(p: nn.Parameter) -> Shard | None:
    """Stacked expert weights shard on dim 1 (dim 0 is the few experts); anything else FSDP2's default."""
    return Shard(1) if p.dim() == 3 else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--wrap", choices=("units", "root"), default="units")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = MoELM(args.layers, args.experts)
    for blk in model.blocks if args.wrap == "units" else ():
        fully_shard(blk.moe.experts, shard_placement_fn=expert_dim1)
        fully_shard(blk)
    fully_shard(model, shard_placement_fn=expert_dim1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, foreach=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(args.steps, 1))
    torch.manual_seed(100 + rank)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        for m in range(args.accum):
            last = m == args.accum - 1
            model.set_requires_gradient_sync(last)
            model.set_reshard_after_backward(last)
            ids = torch.randint(0, VOCAB, (args.batch, SEQ + 1))
            logits, aux = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1)) + 0.01 * aux
            (loss / args.accum).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        steady = sorted(times[5:]) or sorted(times)
        print(f"median step {1000 * steady[len(steady) // 2]:.1f} ms over {len(times)} steps")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
