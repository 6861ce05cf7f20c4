"""A fresh DDP user script for reviewing dagprof: a branch some steps skip, under ``find_unused_parameters=True``.

Habits it exercises, as users write them:
- a multi-task model whose auxiliary head runs on every third step only, so its parameters get no gradient on the
  others; DDP with ``find_unused_parameters=True`` and ``static_graph=False`` (said explicitly);
- ``Adam``, gradient clipping with ``clip_grad_norm_``, a ``StepLR``.

    dagprof profile -o runs/unused -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/unused_branch.py --steps 20
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class MultiTask(nn.Module):
    def __init__(self, vocab: int = 2000, d: int = 128) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, d, mode="mean")
        self.trunk = nn.Sequential(nn.Linear(d, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU())
        self.main_head = nn.Linear(512, 20)
        self.aux = nn.Sequential(nn.Linear(512, 1024), nn.Tanh(), nn.Linear(1024, 5))  # skipped most steps

    def forward(self, tokens: torch.Tensor, with_aux: bool):
        h = self.trunk(self.embed(tokens))
        return self.main_head(h), (self.aux(h) if with_aux else None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--aux-every", type=int, default=3)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = DDP(MultiTask(), find_unused_parameters=True, static_graph=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=8, gamma=0.5)
    for step in range(args.steps):
        tokens = torch.randint(0, 2000, (args.batch, 24))
        y = torch.randint(0, 20, (args.batch,))
        with_aux = step % args.aux_every == 0
        out, aux = model(tokens, with_aux)
        loss = F.cross_entropy(out, y)
        if aux is not None:
            loss = loss + 0.3 * F.cross_entropy(aux, torch.randint(0, 5, (args.batch,)))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    if dist.get_rank() == 0:
        print(f"unused_branch: {args.steps} steps, loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
