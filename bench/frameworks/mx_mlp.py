"""A user's MXNet script: a Gluon MLP with BatchNorm and Dropout, Adam on the servers, ``dist_sync``.

Written as a new user would (``loss.backward(); trainer.step()``, no ``waitall`` between them, so the
engine pushes each gradient as soon as it is ready), with the lines dagprof needs (marked). Run it under
the launcher, which starts the scheduler, servers and workers (DMLC_*)::

    python -m dagprof.collect.hooks.mxnet_ps run --out RUN --servers 1 --workers 2 -- python mx_mlp.py
"""
import argparse

import mxnet as mx
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=14)
ap.add_argument("--batch", type=int, default=64)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
mx.random.seed(42 + kv.rank)
net = gluon.nn.HybridSequential()
with net.name_scope():
    for width in (512, 512, 256):
        net.add(gluon.nn.Dense(width), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"), gluon.nn.Dropout(0.2))
    net.add(gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 1e-3}, kvstore=kv)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
x = nd.random.normal(shape=(args.batch, 784))
y = nd.array([i % 10 for i in range(args.batch)])

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for _ in range(args.steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(args.batch)
        prof.step()  # dagprof (3/3)
print(f"worker {kv.rank}: loss {loss.mean().asscalar():.3f}")
