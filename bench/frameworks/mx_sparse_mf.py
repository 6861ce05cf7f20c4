"""A user's MXNet script: a neural matrix-factorisation recommender (user and item tables as
``gluon.contrib.nn.SparseEmbedding``, their product beside an MLP over their concatenation, a logit) on synthetic
implicit-feedback pairs, logistic loss, ``dist_sync``, as MXNet's sparse tutorials write it.

Habits it exercises that the other MXNet scripts do not: row_sparse parameters (``SparseEmbedding``: a row_sparse
weight and a row_sparse gradient, only the batch's rows pushed, and pulled back with ``row_sparse_pull`` before each
forward), which Gluon's Trainer handles only with the update on the kvstore (``update_on_kvstore=True``, AdaGrad, the
optimizer MXNet's sparse examples use: it updates the rows pushed, lazily; ``rescale_grad`` given to the optimizer and
``trainer.step(1)``, as the kvstore starts before the first ``step``), a ``HybridBlock`` not hybridized (a
sparse parameter cannot be), and the loss read back with ``asscalar`` every 4 steps. The dagprof lines are marked.
Run it under the launcher::

    dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_sparse_mf.py
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

USERS, ITEMS, DIM = 20000, 8000, 32


class NeuMF(gluon.Block):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.users = gluon.contrib.nn.SparseEmbedding(USERS, DIM)
            self.items = gluon.contrib.nn.SparseEmbedding(ITEMS, DIM)
            self.mlp = gluon.nn.HybridSequential()
            self.mlp.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(32, activation="relu"))
            self.out = gluon.nn.Dense(1)

    def forward(self, user, item):
        u, i = self.users(user), self.items(item)
        return self.out(nd.concat(u * i, self.mlp(nd.concat(u, i, dim=1)), dim=1)).reshape((-1,))


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=256)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
rng = np.random.default_rng(11 + kv.rank)
net = NeuMF()
net.initialize(mx.init.Normal(0.05))
# the kvstore starts at the first forward's row_sparse_pull, before any step: the gradient scale goes in up front
trainer = gluon.Trainer(net.collect_params(), "adagrad", {"learning_rate": 0.05, "rescale_grad": 1.0 / args.batch},
                        kvstore=kv, update_on_kvstore=True)
loss_fn = gluon.loss.SigmoidBinaryCrossEntropyLoss()

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        user = nd.array(rng.integers(0, USERS, args.batch))
        item = nd.array(rng.integers(0, ITEMS, args.batch))
        label = nd.array(rng.integers(0, 2, args.batch))
        with autograd.record():
            loss = loss_fn(net(user, item), label)
        loss.backward()
        trainer.step(1)  # the scale is the optimizer's (rescale_grad) already
        prof.step()  # dagprof (3/3)
        if step % 4 == 0 and kv.rank == 0:
            print(f"step {step}: loss {loss.mean().asscalar():.4f}", flush=True)
