"""A user's Horovod script: a GINE graph classifier (Hu et al. 2020's GIN with edge features, small) on synthetic
molecules: atom types and bond types through ``nn.Embedding`` tables, 4 message-passing layers (each a neighbour sum
written with ``index_add_`` then an MLP with ``BatchNorm1d``), a mean pool per graph, a Linear over 2 classes, Adam.

Habits it exercises that the other Horovod scripts do not: graphs of different sizes batched by the user's own
``collate_fn`` (their nodes concatenated, edge indices offset, a graph index per node, as PyTorch Geometric batches),
so each step's work varies with the batch drawn; message passing and pooling written with ``index_add_``; a
``DistributedSampler(..., seed=..., drop_last=True)`` with ``set_epoch``; two parameter groups (no weight decay on
biases, norms and embeddings) handed to ``hvd.DistributedOptimizer(..., named_parameters=...,
compression=hvd.Compression.fp16, op=hvd.Average)``; ``broadcast_parameters``/``broadcast_optimizer_state``; a
cosine schedule stepped every batch; an accuracy counted over all the ranks' graphs with ``hvd.allreduce(...,
op=hvd.Sum)`` after training. No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_gine_molecules.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

parser = argparse.ArgumentParser(description="Horovod GINE on synthetic molecules, fp16 all-reduces")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--graphs", type=int, default=2048)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--hidden", type=int, default=128)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

ATOMS, BONDS, LAYERS = 28, 4, 4


class Molecules(Dataset):
    """Random connected graphs (a chain plus a few ring bonds) of 10-40 atoms; label: whether rare atoms abound."""

    def __init__(self, count):
        self.count = count

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        n = int(torch.randint(10, 41, (1,), generator=g))
        atoms = torch.randint(0, ATOMS, (n,), generator=g)
        chain = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
        rings = torch.randint(0, n, (2, n // 4), generator=g)
        edges = torch.cat([chain, rings], 1)
        edges = torch.cat([edges, edges.flip(0)], 1)  # both directions
        bonds = torch.randint(0, BONDS, (edges.shape[1] // 2,), generator=g).repeat(2)
        return atoms, edges, bonds, int((atoms >= 20).float().mean() > 0.28)


def collate(graphs):
    """One big disconnected graph: nodes concatenated, each graph's edges shifted by the nodes before it."""
    atoms, edges, bonds, labels, owner, offset = [], [], [], [], [], 0
    for k, (a, e, b, y) in enumerate(graphs):
        atoms.append(a)
        edges.append(e + offset)
        bonds.append(b)
        labels.append(y)
        owner.append(torch.full((a.shape[0],), k))
        offset += a.shape[0]
    return torch.cat(atoms), torch.cat(edges, 1), torch.cat(bonds), torch.tensor(labels), torch.cat(owner)


class GINE(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.atom = nn.Embedding(ATOMS, hidden)
        self.bond = nn.ModuleList(nn.Embedding(BONDS, hidden) for _ in range(LAYERS))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.BatchNorm1d(2 * hidden), nn.ReLU(), nn.Linear(2 * hidden, hidden))
            for _ in range(LAYERS))
        self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(LAYERS))
        self.eps = nn.Parameter(torch.zeros(LAYERS))
        self.head = nn.Linear(hidden, 2)

    def forward(self, atoms, edges, bonds, owner, graphs):
        h = self.atom(atoms)
        src, dst = edges
        for i in range(LAYERS):
            msg = F.relu(h[src] + self.bond[i](bonds))
            agg = torch.zeros_like(h).index_add_(0, dst, msg)
            h = h + F.relu(self.norms[i](self.mlps[i]((1 + self.eps[i]) * h + agg)))
        pooled = torch.zeros(graphs, h.shape[1]).index_add_(0, owner, h)
        counts = torch.zeros(graphs).index_add_(0, owner, torch.ones(owner.shape[0]))
        return self.head(pooled / counts[:, None])


if __name__ == "__main__":
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(11)
    dataset = Molecules(args.graphs)
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=5, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, collate_fn=collate, drop_last=True)
    model = GINE(args.hidden)
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or n.startswith(("atom", "bond"))]
    decay = [p for n, p in model.named_parameters() if not (p.ndim < 2 or n.startswith(("atom", "bond")))]
    optimizer = torch.optim.Adam([{"params": decay, "weight_decay": 1e-5}, {"params": no_decay, "weight_decay": 0.0}],
                                 lr=args.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16, op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)

    model.train()
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for atoms, edges, bonds, labels, owner in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(atoms, edges, bonds, owner, labels.shape[0]), labels)
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            if hvd.rank() == 0 and step % 5 == 0:
                print(f"step {step}: loss {loss.item():.4f}", flush=True)
            if step >= args.steps:
                break
        epoch += 1

    model.eval()
    hits = torch.zeros(2)
    with torch.no_grad():
        for atoms, edges, bonds, labels, owner in loader:
            pred = model(atoms, edges, bonds, owner, labels.shape[0]).argmax(1)
            hits += torch.tensor([float((pred == labels).sum()), float(labels.shape[0])])
            if hits[1] >= 4 * args.batch_size:
                break
    hits = hvd.allreduce(hits, op=hvd.Sum, name="accuracy_counts")
    if hvd.rank() == 0:
        print(f"accuracy {hits[0] / hits[1]:.3f} over {int(hits[1])} graphs", flush=True)
