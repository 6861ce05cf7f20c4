"""A fresh DDP user script for reviewing dagprof (stop 67): a transformer classifying DNA k-mer sequences, trained with LayerDrop.

Habits it exercises, as sequence-model users write them after fairseq (no other fresh script has them together):
- LayerDrop (Fan et al. 2019): each training step every rank skips each of the ``--layers`` encoder blocks with
  probability ``--layerdrop``, drawn from its OWN generator, so the ranks run different graphs in the same step and
  leave different parameters unused; ``DistributedDataParallel(find_unused_parameters=True)`` as the error message asks;
- overlapping 3-mers of A/C/G/T as tokens (64 + CLS), a learned position table, mean-pooled features into a promoter /
  not-promoter head; labels from planted motifs (TATA box near the end, GC-rich start) so the loss falls;
- a map-style ``Dataset`` through ``DistributedSampler(shuffle=True)`` and ``DataLoader(num_workers=1,
  persistent_workers=True)``: batches are made in a worker process, not the training thread;
- ``Adam(amsgrad=True, foreach=True)``; ``ReduceLROnPlateau`` on a validation loss all-reduced every ``--val-every``
  steps (evaluated with every layer on, ``model.eval()`` under ``torch.no_grad()``).
Without a profiler it prints its median step from step 4 on (validation steps included, as the user's clock counts them).

    dagprof profile -o runs/dna -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/layerdrop_dna.py
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
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

log = logging.getLogger("dna")
CLS = 64


class Promoters(Dataset):
    """Random sequences, half of them with a TATA box near the end and a GC-rich start (label 1)."""

    def __init__(self, n: int, length: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.seqs = torch.randint(4, (n, length), generator=g)
        self.labels = (torch.rand(n, generator=g) < 0.5).long()
        for i in torch.nonzero(self.labels).flatten().tolist():
            at = length - 30 + int(torch.randint(10, (1,), generator=g))
            self.seqs[i, at:at + 6] = torch.tensor([3, 0, 3, 0, 0, 0])  # TATAAA
            self.seqs[i, :12] = torch.where(torch.rand(12, generator=g) < 0.8, 1 + torch.randint(2, (12,), generator=g), self.seqs[i, :12])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.seqs[i]
        kmers = s[:-2] * 16 + s[1:-1] * 4 + s[2:]
        return torch.cat([torch.tensor([CLS]), kmers]), self.labels[i]


class LayerDropEncoder(nn.Module):
    def __init__(self, dim: int, heads: int, layers: int, length: int, layerdrop: float, seed: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(CLS + 1, dim)
        self.pos = nn.Embedding(length, dim)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1, batch_first=True)
                                    for _ in range(layers))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2))
        self.layerdrop = layerdrop
        self.dice = torch.Generator().manual_seed(seed)  # each rank its own: the ranks skip different blocks

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            if self.training and float(torch.rand(1, generator=self.dice)) < self.layerdrop:
                continue
            h = block(h)
        return self.head(h.mean(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=66, help="bases a sequence (tokens: length - 2 k-mers + CLS)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--layerdrop", type=float, default=0.2)
    p.add_argument("--val-every", type=int, default=5)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train, val = Promoters(4000, args.length, 1), Promoters(64, args.length, 2)
    sampler = DistributedSampler(train, shuffle=True, seed=5)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler, num_workers=1, persistent_workers=True)
    model = DDP(LayerDropEncoder(args.dim, args.heads, args.layers, args.length - 1, args.layerdrop, seed=1000 + rank),
                find_unused_parameters=True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-4, amsgrad=True, foreach=True)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1)
    vx = torch.stack([val[i][0] for i in range(len(val))])[rank::world]
    vy = val.labels[rank::world]
    times: list[float] = []
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for ids, label in loader:
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(ids), label)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step % args.val_every == 0:
                model.eval()
                with torch.no_grad():
                    vloss = F.cross_entropy(model(vx), vy)
                model.train()
                dist.all_reduce(vloss)
                plateau.step(vloss.item() / world)
                if rank == 0:
                    log.info("step %d loss %.4f val %.4f lr %.1e", step, loss.item(), vloss.item() / world, opt.param_groups[0]["lr"])
            times.append(time.perf_counter() - t0)
            if step >= args.steps:
                break
        epoch += 1
    if rank == 0 and len(times) > 4:
        print(f"median step {1000 * statistics.median(times[4:]):.1f} ms over {len(times) - 4} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
