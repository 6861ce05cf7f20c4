"""A fresh DDP user script for reviewing dagprof (stop 65): a graph-attention network (GAT) on random planted-partition graphs.

Habits it exercises, as GNN users write them without PyTorch Geometric (no other fresh script has them together):
- multi-head graph attention by hand over an edge list: per-edge scores ``leaky_relu(a_src[src] + a_dst[dst])``, a
  softmax over each node's incoming edges (``scatter_reduce(amax)`` for the max, ``index_add_`` for the sums),
  messages summed into nodes with ``index_add_``; attention dropout; ELU between layers;
- an auxiliary link-prediction head that only takes part every ``--aux-every``-th step, so the job is wrapped with
  ``DistributedDataParallel(find_unused_parameters=True)`` (the other steps leave that head's parameters unused);
- a new graph per rank and step, of a random size (ranks and steps differ in work), full-batch on each rank;
- ``Adam(weight_decay=5e-4)``, ``MultiStepLR``, ``clip_grad_norm_(5.0)`` every step, accuracy all-reduced each log.
Without a profiler it prints its median step from step 4 on.

    dagprof profile -o runs/gat -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/gat_edges.py
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


def planted_graph(nodes: int, classes: int, feats: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Features, labels and a directed edge list (with self loops) where same-class nodes link 8x more often."""
    y = torch.randint(classes, (nodes,), generator=g)
    centres = torch.randn(classes, feats, generator=torch.Generator().manual_seed(7))
    x = centres[y] + 1.5 * torch.randn(nodes, feats, generator=g)
    src = torch.randint(nodes, (nodes * 12,), generator=g)
    dst = torch.randint(nodes, (nodes * 12,), generator=g)
    keep = (y[src] == y[dst]) | (torch.rand(src.shape, generator=g) < 0.125)
    loops = torch.arange(nodes)
    return x, y, torch.cat([src[keep], loops]), torch.cat([dst[keep], loops])


class GATLayer(nn.Module):
    def __init__(self, din: int, dout: int, heads: int, concat: bool, dropout: float) -> None:
        super().__init__()
        self.heads, self.dout, self.concat = heads, dout, concat
        self.lin = nn.Linear(din, heads * dout, bias=False)
        self.a_src = nn.Parameter(torch.randn(heads, dout) * 0.1)
        self.a_dst = nn.Parameter(torch.randn(heads, dout) * 0.1)
        self.bias = nn.Parameter(torch.zeros(heads * dout if concat else dout))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        h = self.lin(x).view(n, self.heads, self.dout)
        score = F.leaky_relu((h * self.a_src).sum(-1)[src] + (h * self.a_dst).sum(-1)[dst], 0.2)  # edges x heads
        peak = torch.full((n, self.heads), -1e9).scatter_reduce(0, dst[:, None].expand_as(score), score, "amax")
        w = torch.exp(score - peak[dst])
        total = torch.zeros(n, self.heads).index_add_(0, dst, w)
        alpha = self.drop(w / total[dst].clamp_min(1e-16))
        out = torch.zeros_like(h).index_add_(0, dst, h[src] * alpha[..., None])
        out = out.flatten(1) if self.concat else out.mean(1)
        return out + self.bias


class GAT(nn.Module):
    def __init__(self, feats: int, hidden: int, heads: int, classes: int) -> None:
        super().__init__()
        self.l1 = GATLayer(feats, hidden, heads, True, 0.2)
        self.l2 = GATLayer(hidden * heads, hidden, heads, True, 0.2)
        self.out = GATLayer(hidden * heads, classes, 1, False, 0.2)
        self.link = nn.Sequential(nn.Linear(2 * hidden * heads, hidden), nn.ReLU(), nn.Linear(hidden, 1))  # auxiliary

    def forward(self, x, src, dst, pairs=None):
        h = F.elu(self.l1(F.dropout(x, 0.3, self.training), src, dst))
        h = F.elu(self.l2(h, src, dst))
        logits = self.out(h, src, dst)
        if pairs is None:
            return logits, None
        return logits, self.link(torch.cat([h[pairs[0]], h[pairs[1]]], -1)).squeeze(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--nodes", type=int, default=1500, help="mean nodes per rank's graph")
    p.add_argument("--feats", type=int, default=128)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--aux-every", type=int, default=3)
    p.add_argument("--log-every", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(GAT(args.feats, args.hidden, args.heads, 6), find_unused_parameters=True)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[args.steps // 2], gamma=0.5)
    g = torch.Generator().manual_seed(100 + rank)
    stamps: list[float] = []
    for step in range(1, args.steps + 1):
        n = int(args.nodes * (0.7 + 0.6 * torch.rand(1, generator=g).item()))
        x, y, src, dst = planted_graph(n, 6, args.feats, g)
        model.train()
        aux = step % args.aux_every == 0
        pos = torch.randint(src.numel(), (256,), generator=g)
        pairs = (torch.cat([src[pos], torch.randint(n, (256,), generator=g)]),
                 torch.cat([dst[pos], torch.randint(n, (256,), generator=g)])) if aux else None
        logits, link = model(x, src, dst, pairs)
        loss = F.cross_entropy(logits, y)
        if link is not None:
            loss = loss + 0.5 * F.binary_cross_entropy_with_logits(link, torch.cat([torch.ones(256), torch.zeros(256)]))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        sched.step()
        if step % args.log_every == 0:
            acc = torch.tensor([(logits.argmax(-1) == y).sum().item(), n], dtype=torch.float64)
            dist.all_reduce(acc)
            if rank == 0:
                print(f"step {step} loss {loss.item():.3f} acc {acc[0] / acc[1]:.3f}", flush=True)
        stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][3:]
    if rank == 0 and gaps:
        print(f"median step {1000 * statistics.median(gaps):.1f} ms over {len(gaps)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
