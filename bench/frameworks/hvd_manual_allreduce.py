"""A user's Horovod script: a matrix-factorisation recommender (user and item ``nn.Embedding(sparse=True)``
tables, a small MLP over their concatenation) on synthetic ratings, its gradient exchange written by hand.

Habits it exercises that the other Horovod scripts do not: no ``DistributedOptimizer``; after ``backward()``
the dense gradients go out with ``hvd.grouped_allreduce_async_`` (one group, averaged in place) and each
sparse embedding gradient with ``hvd.sparse_allreduce_async`` (Horovod all-gathers its indices and values:
``sparse_as_dense`` left off), then ``hvd.synchronize`` on every handle before ``optimizer.step()`` (plain
``torch.optim.SGD``, which takes sparse gradients); parameters broadcast with ``hvd.broadcast_parameters``.
No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_manual_allreduce.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod recommender, hand-written all-reduces")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=256)
parser.add_argument("--users", type=int, default=20000)
parser.add_argument("--items", type=int, default=5000)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

hvd.init()
torch.manual_seed(7)
torch.set_num_threads(1)


class Recommender(nn.Module):
    def __init__(self, users, items, dim=32):
        super().__init__()
        self.user = nn.Embedding(users, dim, sparse=True)
        self.item = nn.Embedding(items, dim, sparse=True)
        self.mlp = nn.Sequential(nn.Linear(2 * dim, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, u, i):
        return self.mlp(torch.cat([self.user(u), self.item(i)], dim=1)).squeeze(1)


g = torch.Generator().manual_seed(hvd.rank())
batches = [(torch.randint(0, args.users, (args.batch_size,), generator=g), torch.randint(0, args.items, (args.batch_size,), generator=g),
            torch.rand(args.batch_size, generator=g) * 5) for _ in range(8)]

model = Recommender(args.users, args.items)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
dense = [(n, p) for n, p in model.named_parameters() if not n.startswith(("user.", "item."))]
sparse = [(n, p) for n, p in model.named_parameters() if n.startswith(("user.", "item."))]

for step in range(args.steps):
    u, i, r = batches[step % len(batches)]
    optimizer.zero_grad()
    loss = F.mse_loss(model(u, i), r)
    loss.backward()
    group = hvd.grouped_allreduce_async_([p.grad for _, p in dense], name="dense_grads", op=hvd.Average)
    pending = [(p, hvd.sparse_allreduce_async(p.grad, name=f"sparse.{n}", op=hvd.Average)) for n, p in sparse]
    hvd.synchronize(group)
    for p, handle in pending:
        p.grad = handle()  # the averaged sparse gradient (its rows from every rank)
    optimizer.step()
    if hvd.rank() == 0 and step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
