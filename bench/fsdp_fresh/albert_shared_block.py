"""A fresh FSDP2 user script for reviewing dagprof (stop 67): an ALBERT-style masked LM whose one encoder layer is shared by depth.

Habits it exercises, as users write them from the ALBERT paper (no other fresh script has them together):
- cross-layer parameter sharing: ONE ``nn.TransformerEncoderLayer`` (pre-norm, GELU) applied ``--depth`` times a forward,
  so its ``fully_shard`` unit runs its hooks ``--depth`` times a step (with the default ``reshard_after_forward=True`` it
  is all-gathered again for every call, in forward and in backward);
- a factorised embedding (vocab x 64, then a 64 -> hidden projection) whose table is tied to the MLM decoder, both in the
  root unit; a sentence-order-prediction (SOP) head on the first token beside the MLM loss;
- ``fully_shard`` on the shared layer, then on the root; ``AdamW(fused=True)`` (the CPU fused kernel) with a linear
  warm-up by ``LambdaLR``; ``clip_grad_norm_`` over the sharded parameters.
Without a profiler it prints its median step from step 4 on.

    dagprof profile -o runs/albert -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/albert_shared_block.py
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

log = logging.getLogger("albert")
MASK, CLS = 1, 2


class Albert(nn.Module):
    def __init__(self, vocab: int, embed: int, hidden: int, heads: int, depth: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, embed)
        self.pos = nn.Parameter(torch.randn(1, 512, embed) * 0.02)
        self.up = nn.Linear(embed, hidden)
        self.shared = nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.1, activation="gelu", batch_first=True,
                                                 norm_first=True)
        self.depth = depth
        self.norm = nn.LayerNorm(hidden)
        self.down = nn.Linear(hidden, embed)  # MLM transform back to the embedding width, then the tied table
        self.bias = nn.Parameter(torch.zeros(vocab))
        self.sop = nn.Linear(hidden, 2)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.up(self.tok(ids) + self.pos[:, :ids.shape[1]])
        for _ in range(self.depth):
            h = self.shared(h)
        h = self.norm(h)
        logits = F.gelu(self.down(h)) @ self.tok.weight.T + self.bias
        return logits, self.sop(h[:, 0])


def batch(g: torch.Generator, n: int, seq: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two 'segments' of a Zipf-ish token stream, swapped for half the rows (the SOP label); 15 % of tokens masked."""
    half = seq // 2
    ranks = torch.randint(1, vocab // 4, (n, seq), generator=g)
    toks = (vocab // 4 * torch.rand(n, seq, generator=g) ** 3).long().clamp(3, vocab - 1) + ranks % 3
    swap = torch.rand(n, generator=g) < 0.5
    toks[swap] = torch.cat([toks[swap, half:], toks[swap, :half]], 1)
    toks[:, 0] = CLS
    target = toks.clone()
    masked = (torch.rand(n, seq, generator=g) < 0.15) & (toks != CLS)
    toks[masked] = MASK
    target[~masked] = -100
    return toks, target, swap.long()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank")
    p.add_argument("--seq", type=int, default=48)
    p.add_argument("--vocab", type=int, default=3000)
    p.add_argument("--embed", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--depth", type=int, default=4, help="times the one shared layer runs a forward")
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Albert(args.vocab, args.embed, args.hidden, args.heads, args.depth)
    fully_shard(model.shared)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
    g = torch.Generator().manual_seed(100 + rank)
    times: list[float] = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        ids, target, order = batch(g, args.batch, args.seq, args.vocab)
        logits, sop = model(ids)
        mlm = F.cross_entropy(logits.reshape(-1, args.vocab), target.reshape(-1))
        loss = mlm + F.cross_entropy(sop, order)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        if rank == 0 and step % 5 == 0:
            log.info("step %d mlm %.3f loss %.3f lr %.2e", step, mlm.item(), loss.item(), sched.get_last_lr()[0])
    if rank == 0 and len(times) > 4:
        print(f"median step {1000 * statistics.median(times[4:]):.1f} ms over {len(times) - 4} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
