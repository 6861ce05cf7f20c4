"""A fresh DDP user script for reviewing dagprof: reentrant activation checkpointing under ``static_graph=True``, tied embeddings.

Habits it exercises, as users write them (none of the other fresh DDP scripts has them):
- ``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)`` on every block: backward runs each block's forward
  again; DDP needs ``static_graph=True`` for it (a reentrant backward would mark the tied weight ready twice otherwise);
- the output projection reuses the input embedding's weight (one parameter used by two modules, in one bucket);
- ``gradient_as_bucket_view=True``; AdamW with two parameter groups (no weight decay on norms and biases) and a
  warm-up ``LambdaLR``; ``dagprof.profile`` in the script itself with ``--dagprof RUN`` (the API, not the launcher).

    dagprof profile -o runs/ckpt --steps 4:10 -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/ckpt_static_tied.py
    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/ckpt_static_tied.py --dagprof runs/ckpt-api
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class TiedLM(nn.Module):
    def __init__(self, vocab: int = 4000, d: int = 256, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True)
        return self.head(self.norm(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dagprof", default="", help="profile steps 4:10 with dagprof.profile into this folder")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(TiedLM(), static_graph=True, gradient_as_bucket_view=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    gen = torch.Generator().manual_seed(dist.get_rank())
    if args.dagprof:
        import dagprof

        prof = dagprof.profile(args.dagprof, steps=range(4, 10), model=model)
    else:
        prof = None
    times = []
    with prof if prof is not None else contextlib.nullcontext():
        for _ in range(args.steps):
            t0 = time.perf_counter()
            tokens = torch.randint(0, 4000, (args.batch, args.seq + 1), generator=gen)
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
            if prof is not None:
                prof.step()
    if dist.get_rank() == 0:
        print(f"ckpt_static_tied: {args.steps} steps, loss {loss.item():.3f}, median step {statistics.median(times[min(5, len(times) // 2):]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
