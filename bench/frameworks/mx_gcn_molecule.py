"""A user's MXNet script: a graph convolutional network (Kipf & Welling 2017) regressing a property of synthetic
molecules (up to 24 atoms of 12 types, bonds as a dense padded adjacency), ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: graphs as padded dense tensors (atom types, a symmetric
normalised adjacency ``D^-1/2 (A + I) D^-1/2`` and an atom mask) multiplied by ``F.batch_dot`` inside a hybridized block
(``hybridize(static_alloc=True, static_shape=True)``), an atom-type ``gluon.nn.Embedding`` (a dense gradient), a masked
sum readout, batches from ``gluon.data.DataLoader`` over an ``ArrayDataset`` (``shuffle=True``,
``last_batch="rollover"``, re-iterated each epoch), LAMB on the servers with an ``mx.lr_scheduler.CosineScheduler``
and a linear warm-up, a ``HuberLoss``, ``trainer.step(batch, ignore_stale_grad=True)``, and an ``mx.metric.MAE``
updated every step and read at the end. The dagprof lines are marked. Run it under the launcher
(``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_gcn_molecule.py``).
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from dagprof.collect import mxnet_ps  # dagprof (1/3)

ATOMS, TYPES = 24, 12


class GCN(gluon.HybridBlock):
    def __init__(self, dim=64, layers=3, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(TYPES, dim)
            self.convs = gluon.nn.HybridSequential()
            for _ in range(layers):
                self.convs.add(gluon.nn.Dense(dim, flatten=False, use_bias=False))
            self.head = gluon.nn.HybridSequential()
            self.head.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(1))

    def hybrid_forward(self, F, atoms, adj, mask):
        h = self.embed(atoms)  # (batch, atoms, dim)
        for conv in self.convs:
            h = F.relu(F.batch_dot(adj, conv(h))) + h
        pooled = F.sum(F.broadcast_mul(h, F.expand_dims(mask, 2)), axis=1)
        return self.head(pooled)


def molecules(seed, n):
    """Random chains with branches; the target sums per-type contributions and the ring-free bond count's effect."""
    rng = np.random.default_rng(seed)
    atoms = np.zeros((n, ATOMS), np.float32)
    adj = np.zeros((n, ATOMS, ATOMS), np.float32)
    mask = np.zeros((n, ATOMS), np.float32)
    y = np.zeros(n, np.float32)
    weights = np.random.default_rng(0).normal(0, 1, TYPES)
    for i in range(n):
        k = rng.integers(6, ATOMS + 1)
        atoms[i, :k] = rng.integers(1, TYPES, k)
        parents = [rng.integers(0, j) for j in range(1, k)]
        a = np.eye(ATOMS, dtype=np.float32)
        for j, p in enumerate(parents, 1):
            a[j, p] = a[p, j] = 1
        a[k:, :] = a[:, k:] = 0
        deg = a.sum(1)
        inv = np.where(deg > 0, deg ** -0.5, 0)
        adj[i] = a * inv[:, None] * inv[None, :]
        mask[i, :k] = 1
        y[i] = weights[atoms[i, :k].astype(int)].sum() + 0.2 * np.bincount(parents, minlength=ATOMS).max()
    return atoms, adj, mask, y


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=32)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
mx.random.seed(11 + kv.rank)
loader = gluon.data.DataLoader(gluon.data.ArrayDataset(*molecules(30 + kv.rank, 10 * args.batch)), batch_size=args.batch,
                               shuffle=True, last_batch="rollover")
net = GCN()
net.initialize(mx.init.Xavier())
net.hybridize(static_alloc=True, static_shape=True)
sched = mx.lr_scheduler.CosineScheduler(max_update=args.steps, base_lr=5e-3, final_lr=5e-4, warmup_steps=3, warmup_begin_lr=1e-4)
trainer = gluon.Trainer(net.collect_params(), "lamb", {"learning_rate": 5e-3, "wd": 1e-5, "lr_scheduler": sched}, kvstore=kv)
loss_fn, mae = gluon.loss.HuberLoss(rho=1.0), mx.metric.MAE()


def batches():
    while True:
        yield from loader


with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for _, (atoms, adj, mask, y) in zip(range(args.steps), batches()):
        with autograd.record():
            pred = net(atoms, adj, mask)
            loss = loss_fn(pred, y)
        loss.backward()
        trainer.step(args.batch, ignore_stale_grad=True)
        mae.update(y, pred.reshape(-1))
        prof.step()  # dagprof (3/3)
print(f"worker {kv.rank}: {mae.get()[0]} {mae.get()[1]:.3f}")
