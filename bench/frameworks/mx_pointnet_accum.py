"""A user's MXNet script: a small PointNet (Qi et al. 2017) classifying synthetic point clouds of 5 shapes (128 points
each): a shared per-point MLP written as ``Dense(flatten=False)`` with ``BatchNorm(axis=2)`` (MXNet 1.9.1's CPU
``Conv1D`` with kernel 1 followed by ``BatchNorm`` fails its backward with ``Check failed: !is_view``, dagprof or not),
a global max pool over the points, a Dense head with Dropout; ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: gradient accumulation over 2 micro-batches
(``grad_req='add'``) whose sum is all-reduced by ``trainer.allreduce_grads()`` and applied by a separate
``trainer.update()`` (``update_on_kvstore=False``: the servers only sum, Adam runs on every worker), the gradients
zeroed with ``zero_grad()`` after the update, the learning rate set by hand each step from a warm-up
(``trainer.set_learning_rate``), points jittered and rotated about the up axis on the fly with ``nd`` ops, and batches
from ``mx.io.NDArrayIter`` (``reset()`` at the end of each pass). The dagprof lines are marked. Run it under the
launcher (``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_pointnet_accum.py``).
"""
import argparse
import math

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

POINTS, CLASSES = 128, 5


class PointNet(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.mlp = gluon.nn.HybridSequential()
            for width in (64, 64, 128):
                self.mlp.add(gluon.nn.Dense(width, flatten=False), gluon.nn.BatchNorm(axis=2), gluon.nn.Activation("relu"))
            self.head = gluon.nn.HybridSequential()
            self.head.add(gluon.nn.Dense(128, activation="relu"), gluon.nn.Dropout(0.3), gluon.nn.Dense(CLASSES))

    def hybrid_forward(self, F, pts):  # pts: (batch, 3, points)
        return self.head(F.max(self.mlp(F.transpose(pts, (0, 2, 1))), axis=1))


def shapes(rank, n):
    """Points on a sphere, cube, cylinder, cone or torus, scaled at random; (n, 3, POINTS) and labels."""
    rng = np.random.default_rng(40 + rank)
    labels = rng.integers(0, CLASSES, n)
    u, v = rng.uniform(0, 2 * np.pi, (2, n, POINTS))
    w = rng.uniform(-1, 1, (n, POINTS))
    clouds = np.empty((n, 3, POINTS), np.float32)
    for i, c in enumerate(labels):
        if c == 0:
            p = (np.cos(u[i]) * np.sqrt(1 - w[i] ** 2), np.sin(u[i]) * np.sqrt(1 - w[i] ** 2), w[i])
        elif c == 1:
            p = tuple(np.clip(rng.uniform(-1.5, 1.5, (3, POINTS)), -1, 1))
        elif c == 2:
            p = (np.cos(u[i]), np.sin(u[i]), w[i])
        elif c == 3:
            p = ((1 - w[i]) / 2 * np.cos(u[i]), (1 - w[i]) / 2 * np.sin(u[i]), w[i])
        else:
            p = ((1 + 0.3 * np.cos(v[i])) * np.cos(u[i]), (1 + 0.3 * np.cos(v[i])) * np.sin(u[i]), 0.3 * np.sin(v[i]))
        clouds[i] = np.stack(p) * rng.uniform(0.7, 1.3)
    return clouds, labels.astype(np.float32)


def augment(pts):
    """Rotate each cloud by a random angle about z and jitter every point."""
    theta = nd.random.uniform(0, 2 * math.pi, shape=(pts.shape[0],))
    c, s = nd.cos(theta), nd.sin(theta)
    x, y, z = nd.split(pts, 3, axis=1, squeeze_axis=True)
    rot = nd.stack(nd.broadcast_mul(c.expand_dims(1), x) - nd.broadcast_mul(s.expand_dims(1), y),
                   nd.broadcast_mul(s.expand_dims(1), x) + nd.broadcast_mul(c.expand_dims(1), y), z, axis=1)
    return rot + 0.01 * nd.random.normal(shape=pts.shape)


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--accum", type=int, default=2, help="micro-batches per update")
ap.add_argument("--lr", type=float, default=2e-3)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
mx.random.seed(5 + kv.rank)
clouds, labels = shapes(kv.rank, 12 * args.batch)
it = mx.io.NDArrayIter(clouds, labels, batch_size=args.batch, shuffle=True, last_batch_handle="discard")

net = PointNet()
net.initialize(mx.init.Xavier())
net.hybridize()
net.collect_params().setattr("grad_req", "add")
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": args.lr, "wd": 1e-4}, kvstore=kv,
                        update_on_kvstore=False)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()


def next_batch():
    try:
        return it.next()
    except StopIteration:
        it.reset()
        return it.next()


with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        trainer.set_learning_rate(args.lr * min(1.0, (step + 1) / 4))
        for _ in range(args.accum):
            b = next_batch()
            with autograd.record():
                loss = loss_fn(net(augment(b.data[0])), b.label[0])
            loss.backward()
        trainer.allreduce_grads()  # the summed micro-batches' gradients through the servers
        trainer.update(args.accum * args.batch)
        net.collect_params().zero_grad()
        prof.step()  # dagprof (3/3)
        if step % 5 == 4 and kv.rank == 0:
            print(f"step {step}: loss {loss.mean().asscalar():.3f}", flush=True)
print(f"worker {kv.rank}: done")
