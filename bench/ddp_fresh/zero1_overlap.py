"""A fresh DDP user script for reviewing dagprof: ZeRO-1 overlapped with DDP's backward.

Habits it exercises, as users write them:
- ``ZeroRedundancyOptimizer(..., optimizer_class=torch.optim.AdamW, overlap_with_ddp=True)`` with DDP's comm hook
  ``hook_with_zero_step(allreduce_hook, ddp, zero)``: when the last gradient bucket's hook runs, each rank steps the
  buckets it owns as their all-reduces complete and broadcasts each bucket from its owner, inside backward; the loop
  calls no ``step()`` (torch warns that it should not), and the first two iterations do not update (DDP's buckets are
  not final yet), so the script runs two warm-up iterations on dummy data first, as torch's docstring advises;
- torch refuses that hook on a plain ``"gloo"`` group ("may meet hangs"); a CPU job names the backend per device
  (``"cpu:gloo"``), as mixed CPU/GPU jobs do, which the check passes;
- a small transformer text classifier (token + position embeddings, pre-norm encoder layers, mean pooling), AdamW with
  weight decay, ``zero_grad(set_to_none=True)`` each iteration.

    dagprof profile -o runs/zero1_overlap -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/zero1_overlap.py
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


class TextClassifier(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int, classes: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, seq, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.tok(tokens) + self.pos[:, : tokens.shape[1]])
        return self.head(self.norm(h).mean(dim=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=4000)
    ap.add_argument("--bucket-cap-mb", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=3e-4)
    args = ap.parse_args()
    dist.init_process_group("cpu:gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(TextClassifier(args.vocab, args.dim, 4, args.layers, args.seq, 4), bucket_cap_mb=args.bucket_cap_mb)
    zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=args.lr,
                                   weight_decay=0.01, overlap_with_ddp=True)
    model.register_comm_hook(None, hook_with_zero_step(allreduce_hook, model, zero))
    torch.manual_seed(1 + rank)
    for _ in range(2):  # ZeRO learns DDP's final buckets here; these iterations do not update
        model(torch.zeros(args.batch, args.seq, dtype=torch.long)).sum().backward()
        zero.zero_grad(set_to_none=True)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        x = torch.randint(0, args.vocab, (args.batch, args.seq))
        y = torch.randint(0, 4, (args.batch,))
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # the comm hook steps the owned shard and broadcasts every bucket's parameters
        zero.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        tail = sorted(times[5:])
        print(f"zero1_overlap: {args.steps} steps, {n / 1e6:.2f} M params, loss {loss.item():.3f}, "
              f"median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
