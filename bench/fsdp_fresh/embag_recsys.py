"""A fresh user script for reviewing dagprof's DDP -> FSDP conversion: a click-through recommender of embedding bags.

Habits it exercises (not dagprof's own scripts, none of the mixer, ResNet or LoRA jobs the conversion was developed on):
- sparse features as bags of ids (``nn.EmbeddingBag``, mode ``sum``, ``offsets``) in a ``ModuleDict`` of tables by feature
  name, dense gradients (``fully_shard`` needs them), a bottom MLP over dense features, the pooled embeddings and the
  dense vector concatenated, then numbered residual blocks (``layers``) and a logit;
- ``--wrap fsdp``: ``fully_shard`` on every block then the root (the tables stay in the root: one large all-gather);
  ``--wrap ddp``: ``DistributedDataParallel``;
- ``Adam`` with weight decay on everything but the tables, ``BCEWithLogitsLoss`` on clicks, no gradient clipping.

    dagprof profile -o runs/rec-ddp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/embag_recsys.py --wrap ddp
    dagprof whatif runs/rec-ddp --data-parallel fsdp     # against: the same with --wrap fsdp
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn

FEATURES = {"user": 12000, "item": 6000, "city": 400, "device": 16}  # rows per table


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Recommender(nn.Module):
    def __init__(self, emb: int, dense: int, width: int, depth: int) -> None:
        super().__init__()
        self.tables = nn.ModuleDict({k: nn.EmbeddingBag(rows, emb, mode="sum") for k, rows in FEATURES.items()})
        self.bottom = nn.Sequential(nn.Linear(dense, emb), nn.ReLU())
        self.mix = nn.Linear(emb * (len(FEATURES) + 1), width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, 1)

    def forward(self, ids: dict[str, tuple[torch.Tensor, torch.Tensor]], dense: torch.Tensor) -> torch.Tensor:
        pooled = [self.tables[k](v, off) for k, (v, off) in ids.items()]
        x = self.mix(torch.cat(pooled + [self.bottom(dense)], dim=1))
        for blk in self.layers:
            x = blk(x)
        return self.out(x).squeeze(1)


def batch(size: int, dense: int, gen: torch.Generator) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """A batch of ``size`` impressions: per feature a bag of 1-8 ids each (flat ids and offsets), dense features, clicks."""
    ids = {}
    for k, rows in FEATURES.items():
        lens = torch.randint(1, 9, (size,), generator=gen)
        ids[k] = (torch.randint(0, rows, (int(lens.sum()),), generator=gen), torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)[:-1]]))
    return ids, torch.randn(size, dense, generator=gen), torch.randint(0, 2, (size,), generator=gen).float()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--emb", type=int, default=32)
    p.add_argument("--dense", type=int, default=13)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Recommender(args.emb, args.dense, args.width, args.depth)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in model.layers:
            fully_shard(blk)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    tables = [q for n, q in model.named_parameters() if "tables." in n]
    rest = [q for n, q in model.named_parameters() if "tables." not in n]
    opt = torch.optim.Adam([{"params": tables, "weight_decay": 0.0}, {"params": rest, "weight_decay": 1e-5}], lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        ids, dense, click = batch(args.batch, args.dense, gen)
        loss = loss_fn(model(ids, dense), click)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} median step {1e3 * tail[len(tail) // 2]:.1f} ms, loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
