"""A fresh embedding job (issue 20, held out for PowerSGD's pricing): a BERT4Rec-style masked item model (Sun et al.
2019) under DDP, users' item sequences with items masked at random and predicted from both sides.

Habits, as users write them (no other fresh script has this family or these habits together):
- an item table with a padding row and a mask row, scored against every item through the same table (weight tying by
  ``x @ items.weight.T``) plus an output bias, learned positions, two pre-norm ``nn.TransformerEncoderLayer`` blocks
  with a key padding mask;
- sequences of varying length from a popularity-skewed catalogue, right-padded, 20 % of real positions masked, the loss
  only where masked (``ignore_index=-100``);
- AdamW with two parameter groups (no weight decay on the tables, biases and norms), a linear warm-up by
  ``LambdaLR``, ``zero_grad(set_to_none=False)``.

    dagprof profile -o runs/bert4rec -- torchrun --standalone --nproc-per-node 2 bench/embed_fresh/bert4rec_masked.py --steps 14
    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/embed_fresh/bert4rec_masked.py --steps 14" \
        --ranks 2 --link 200Mbit --modes lossy --rounds 3 --budget 5 --no-extras --link-model-calibrate
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ITEMS, LEN, DIM = 40000, 24, 64
PAD, MASK = 0, ITEMS + 1  # item ids 1..ITEMS


class Bert4Rec(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.items = nn.Embedding(ITEMS + 2, DIM, padding_idx=PAD)
        self.pos = nn.Embedding(LEN, DIM)
        layer = nn.TransformerEncoderLayer(DIM, 2, 4 * DIM, dropout=0.1, batch_first=True, norm_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(DIM)
        self.out_bias = nn.Parameter(torch.zeros(ITEMS + 2))
        nn.init.normal_(self.items.weight, std=0.02)  # BERT's initialiser

    def forward(self, seq: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.items(seq) + self.pos.weight[: seq.shape[1]]
        h = self.norm(self.encoder(x, src_key_padding_mask=seq == PAD))
        at = targets != -100
        logits = h[at] @ self.items.weight.T + self.out_bias
        return F.cross_entropy(logits, targets[at])


def sequences(n: int, pop: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded item sequences with 20 % of their real positions masked, and the masked items as targets."""
    seq = torch.multinomial(pop, n * LEN, replacement=True, generator=gen).view(n, LEN) + 1
    lengths = torch.randint(LEN // 4, LEN + 1, (n,), generator=gen)
    seq[torch.arange(LEN) >= lengths.unsqueeze(1)] = PAD
    masked = (torch.rand(n, LEN, generator=gen) < 0.2) & (seq != PAD)
    targets = torch.where(masked, seq, torch.full_like(seq, -100))
    return seq.masked_fill(masked, MASK), targets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Bert4Rec())
    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and "items" not in n and "pos" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim == 2 and "items" not in n and "pos" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    gen = torch.Generator().manual_seed(11 + rank)
    pop = 1.0 / torch.arange(1, ITEMS + 1, dtype=torch.float64) ** 0.7
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        seq, targets = sequences(a.batch, pop, gen)
        loss = model(seq, targets)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"bert4rec: loss {loss.item():.4f}, median step {statistics.median(times[3:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
