"""A fresh DDP user script for reviewing dagprof (issue 16): a small mixture-of-experts classifier, top-1 routed, on 2 ranks.

Habits it exercises, as users write them (none of the other fresh DDP scripts has them together):
- a top-1 switch FFN (4 experts): an expert no token of a rank's batch picked gets no gradient on that rank, so
  ``DistributedDataParallel(find_unused_parameters=True)``;
- a ``DataLoader`` with ``num_workers=2`` and a ``DistributedSampler`` over a map-style dataset, ``set_epoch`` each epoch;
- gradient accumulation with ``model.no_sync()`` on all but the last of ``--accum`` micro-batches;
- ``SGD(momentum, nesterov)`` with a ``LinearLR`` warm-up chained into ``CosineAnnealingLR`` (``SequentialLR``);
- a load-balancing auxiliary loss, ``clip_grad_norm_`` and one ``all_reduce`` of the loss for the log line each step.

    dagprof profile -o runs/moe -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/moe_loader.py --steps 20
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

DIM, EXPERTS, CLASSES, FEATURES = 128, 4, 10, 64


class Points(Dataset):
    """Random features, labels from a fixed random projection, so the model has something to learn."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = (self.x @ torch.randn(FEATURES, CLASSES, generator=g)).argmax(-1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class SwitchFFN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM)) for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = F.softmax(self.router(x), dim=-1)
        gate, pick = probs.max(dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows = (pick == e).nonzero(as_tuple=True)[0]
            if len(rows):
                out[rows] = expert(x[rows]) * gate[rows, None]
        share = F.one_hot(pick, EXPERTS).float().mean(0)
        return x + out, EXPERTS * (share * probs.mean(0)).sum()


class MoEClassifier(nn.Module):
    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, DIM)
        self.moe = nn.ModuleList(SwitchFFN() for _ in range(layers))
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, aux = self.inp(x), x.new_zeros(())
        for layer in self.moe:
            h, a = layer(h)
            aux = aux + a
        return self.head(h), aux


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(MoEClassifier(), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, args.steps - 3))
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])
    data = Points(4096)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=2, persistent_workers=True, drop_last=True)
    step, epoch, micro = 0, 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            last = micro == args.accum - 1
            with contextlib.nullcontext() if last else model.no_sync():
                logits, aux = model(x)
                loss = F.cross_entropy(logits, y) + 0.01 * aux
                (loss / args.accum).backward()
            micro += 1
            if not last:
                continue
            micro = 0
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            if dist.get_rank() == 0 and step % 5 == 0:
                print(f"step {step} loss {logged.item() / dist.get_world_size():.3f}", flush=True)
            step += 1
            if step == args.steps:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
