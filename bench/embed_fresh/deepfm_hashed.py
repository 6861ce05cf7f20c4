"""A fresh embedding job (issue 20, held out for PowerSGD's pricing): DeepFM (Guo et al. 2017) on Criteo-like hashed
features under DDP, click-through prediction.

Habits, as users write them (no other fresh script has this family or these habits together):
- 13 numeric fields (``log1p`` of counts, each scaled by its own learned weight) and 26 categorical fields hashed on the
  fly into ONE shared table (the hashing trick: each field's raw 64-bit id mixed with the field's salt, modulo 2**16),
  its first-order weights a second table of width 1 beside it (a column PowerSGD leaves uncompressed);
- the FM's pairwise term by the sum-square trick over the fields' rows, a deep MLP with dropout on the same rows, the
  three logits summed;
- ``BCEWithLogitsLoss`` with ``pos_weight`` for the rare clicks, Adagrad (the CTR habit), and
  ``DDP(model, gradient_as_bucket_view=True)``.

    dagprof profile -o runs/deepfm -- torchrun --standalone --nproc-per-node 2 bench/embed_fresh/deepfm_hashed.py --steps 14
    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/embed_fresh/deepfm_hashed.py --steps 14" \
        --ranks 2 --link 200Mbit --modes lossy --rounds 3 --budget 5 --no-extras --link-model-calibrate
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

NUMERIC, FIELDS, HASH, DIM = 13, 26, 2**16, 16
SALT = torch.arange(1, FIELDS + 1, dtype=torch.int64) * 0x9E3779B1


class DeepFM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rows = nn.Embedding(HASH, DIM)  # shared by every categorical field
        self.first = nn.Embedding(HASH, 1)
        self.num_scale = nn.Parameter(torch.full((NUMERIC, DIM), 0.01))
        self.num_first = nn.Parameter(torch.zeros(NUMERIC))
        self.deep = nn.Sequential(nn.Linear((FIELDS + NUMERIC) * DIM, 256), nn.ReLU(), nn.Dropout(0.2),
                                  nn.Linear(256, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 1))
        nn.init.normal_(self.rows.weight, std=0.01)
        nn.init.zeros_(self.first.weight)

    def forward(self, numeric: torch.Tensor, hashed: torch.Tensor) -> torch.Tensor:
        x = torch.cat([numeric.unsqueeze(2) * self.num_scale, self.rows(hashed)], 1)  # (B, fields, DIM)
        pair = 0.5 * (x.sum(1) ** 2 - (x * x).sum(1)).sum(1)
        linear = self.first(hashed).squeeze(2).sum(1) + numeric @ self.num_first
        return linear + pair + self.deep(x.flatten(1)).squeeze(1)


def batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Counts and raw categorical ids with a long tail per field, hashed; clicks from a hidden logistic rule."""
    counts = torch.poisson(torch.rand(n, NUMERIC, generator=gen) * 20, generator=gen)
    raw = (torch.rand(n, FIELDS, generator=gen) ** 3 * 1e7).long()  # a few frequent ids per field, a long tail
    hashed = ((raw * 0x5BD1E995) ^ SALT) % HASH
    score = (counts[:, 0] - 8) / 4 + (raw[:, 0] < 1000).float() - 2.5
    return torch.log1p(counts), hashed, (torch.rand(n, generator=gen) < torch.sigmoid(score)).float()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1024)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(DeepFM(), gradient_as_bucket_view=True)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(3.0))
    gen = torch.Generator().manual_seed(5 + rank)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        numeric, hashed, click = batch(a.batch, gen)
        loss = loss_fn(model(numeric, hashed), click)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"deepfm: loss {loss.item():.4f}, median step {statistics.median(times[3:]) * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
