"""A fresh DDP user script for reviewing dagprof: a message-passing GNN on random graphs, with gradient accumulation.

Habits it exercises, as users write them (none of the other fresh DDP scripts has them):
- message passing by hand: messages gathered along edges with ``index_select``, summed into nodes with ``index_add_``,
  mean-pooled per graph with ``scatter_reduce`` (no PyTorch Geometric);
- gradient accumulation with ``model.no_sync()`` on all but the last of ``--accum`` micro-batches, the loss divided by
  the micro-batches; ``AdamW`` with weight decay, a cosine schedule; a ``GradScaler``-free fp32 job;
- graphs of random sizes per micro-batch (the node and edge counts differ between ranks and steps).

    dagprof profile -o runs/gnn -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/gnn_scatter_accum.py --steps 12
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def random_batch(graphs: int, gen: torch.Generator, feats: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``graphs`` random graphs of 20-40 nodes and 3 edges a node, batched: node features, edges, graph of each node, labels."""
    xs, edges, owner, base = [], [], [], 0
    for g in range(graphs):
        n = int(torch.randint(20, 41, (1,), generator=gen))
        xs.append(torch.randn(n, feats, generator=gen))
        e = torch.randint(0, n, (2, 3 * n), generator=gen) + base
        edges.append(e)
        owner.append(torch.full((n,), g, dtype=torch.long))
        base += n
    y = torch.randint(0, 4, (graphs,), generator=gen)
    return torch.cat(xs), torch.cat(edges, dim=1), torch.cat(owner), y


class MessagePassing(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.msg = nn.Linear(2 * d, d)
        self.upd = nn.Sequential(nn.Linear(2 * d, d), nn.ReLU(), nn.Linear(d, d))
        self.norm = nn.LayerNorm(d)

    def forward(self, h: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        src, dst = edges
        m = F.relu(self.msg(torch.cat([h.index_select(0, src), h.index_select(0, dst)], dim=-1)))
        agg = torch.zeros_like(h).index_add_(0, dst, m)
        return self.norm(h + self.upd(torch.cat([h, agg], dim=-1)))


class GNN(nn.Module):
    def __init__(self, feats: int = 32, d: int = 128, layers: int = 4, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(feats, d)
        self.layers = nn.ModuleList(MessagePassing(d) for _ in range(layers))
        self.readout = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, classes))

    def forward(self, x: torch.Tensor, edges: torch.Tensor, owner: torch.Tensor, graphs: int) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, edges)
        pooled = torch.zeros(graphs, h.shape[1]).scatter_reduce(0, owner[:, None].expand_as(h), h, reduce="mean", include_self=False)
        return self.readout(pooled)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--graphs", type=int, default=16, help="graphs per micro-batch")
    ap.add_argument("--width", type=int, default=128)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(GNN(d=args.width))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        for micro in range(args.accum):
            x, edges, owner, y = random_batch(args.graphs, gen, 32)
            ctx = model.no_sync() if micro < args.accum - 1 else contextlib.nullcontext()
            with ctx:
                loss = F.cross_entropy(model(x, edges, owner, args.graphs), y) / args.accum
                loss.backward()
        opt.step()
        sched.step()
    if rank == 0:
        print(f"gnn_scatter_accum: {args.steps} steps, last loss {loss.item() * args.accum:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
