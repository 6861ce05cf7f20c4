"""A fresh HSDP user script for reviewing dagprof (issue 16): a small causal transformer on a 2-D mesh.

Habits it exercises, as users write them (not dagprof's own fsdp_train.py, nor the conv net beside it):
- HSDP: ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))`` on 4 ranks, each decoder block a unit,
  the embeddings, final norm and head in the root unit;
- pre-norm blocks with ``F.scaled_dot_product_attention(is_causal=True)`` and a GELU MLP, a learned position table;
- AdamW with two parameter groups (no weight decay on norms, biases and embeddings), a warm-up then cosine schedule
  (``LambdaLR``), ``clip_grad_norm_`` on the DTensor gradients, ``zero_grad(set_to_none=True)``.
Without a profiler it prints its median step from step 4 on (``bench/fresh_rounds.py`` reads it).

    dagprof profile -o runs/hsdp-tf -- torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/hsdp_transformer.py --steps 12
    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/hsdp_transformer.py --shard 2    # 1x2 (2x2 on 4 ranks)
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--ctx", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--replicate", type=int, default=2)
    p.add_argument("--shard", type=int, default=0, help="the shard degree, the replicate degree the rest (default: from --replicate)")
    args = p.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    shard = args.shard or world // args.replicate
    mesh = init_device_mesh("cpu", (world // shard, shard), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = LM(args.vocab, args.dim, args.layers, heads=4, ctx=args.ctx)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    decay = [q for n, q in model.named_parameters() if q.ndim >= 2 and "tok" not in n and "pos" not in n]
    rest = [q for n, q in model.named_parameters() if not (q.ndim >= 2 and "tok" not in n and "pos" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=3e-3, betas=(0.9, 0.95))
    warm = 3
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(args.steps - warm, 1))))
    g = torch.Generator().manual_seed(dist.get_rank())
    model.train()
    times: list[float] = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        idx = torch.randint(0, args.vocab, (args.batch, args.ctx + 1), generator=g)
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), idx[:, 1:].reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        if dist.get_rank() == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    if dist.get_rank() == 0 and len(times) > 4:
        print(f"median step {1000 * statistics.median(times[4:]):.1f} ms over {len(times) - 4} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
