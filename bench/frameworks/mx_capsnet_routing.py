"""A user's MXNet script: a capsule network (Sabour et al. 2017, small: a strided 5x5 convolution, primary capsules of 8
dimensions from a strided 5x5 convolution, ten 16-dimensional digit capsules by three iterations of routing by
agreement, the margin loss, a decoder reconstructing the image from the true class's capsule) on synthetic 28x28
images of ten stroke patterns, ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: routing by agreement written imperatively (a Python loop of
``softmax`` over the coupling logits across the classes, the weighted sums and the agreement as ``batch_dot`` over
(example, class) pairs, the ``squash`` non-linearity), the prediction vectors of every primary capsule for every class
by one ``batch_dot`` over the capsules, a loss written as a plain function (the margin loss plus the reconstruction
loss of a decoder fed the capsules masked by ``nd.one_hot`` of the labels), a ``DataLoader`` over an ``ArrayDataset`` whose images are
normalised by ``transform_first``, Adam with a ``PolyScheduler`` (linear warm-up, then polynomial decay) run on the
servers, the network left imperative (not hybridized). Run it under the launcher, which starts the scheduler, servers
and workers::

    python -m dagprof.collect.hooks.mxnet_ps run --out RUN --servers 1 --workers 2 -- python mx_capsnet_routing.py
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=32)
args = ap.parse_args()

CLASSES, SIZE, PRIMARY, PDIM, DDIM, ROUTING = 10, 28, 8, 8, 16, 3
CAPS = PRIMARY * 4 * 4  # primary capsules: 8 types on the 4x4 grid


def squash(s, axis=-1):
    sq = (s ** 2).sum(axis=axis, keepdims=True)
    return sq / (1 + sq) * s / nd.sqrt(sq + 1e-8)


class CapsNet(gluon.Block):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.conv1 = gluon.nn.Conv2D(16, 5, strides=2, activation="relu")
            self.primary = gluon.nn.Conv2D(PRIMARY * PDIM, 5, strides=2)
            self.W = self.params.get("routing_weight", shape=(CAPS, PDIM, CLASSES * DDIM), init=mx.init.Normal(0.05))
            self.decoder = gluon.nn.Sequential()
            self.decoder.add(gluon.nn.Dense(128, activation="relu"), gluon.nn.Dense(256, activation="relu"),
                             gluon.nn.Dense(SIZE * SIZE, activation="sigmoid"))

    def forward(self, x, y):
        p = self.primary(self.conv1(x))                                              # (B, 64, 4, 4)
        u = squash(p.reshape((0, PRIMARY, PDIM, -1)).transpose((0, 1, 3, 2)).reshape((0, CAPS, PDIM)))
        u_hat = nd.batch_dot(u.transpose((1, 0, 2)), self.W.data())                  # (CAPS, B, CLASSES*DDIM)
        u_hat = u_hat.reshape((CAPS, -1, DDIM)).transpose((1, 0, 2))                 # (B*CLASSES, CAPS, DDIM)
        logits = nd.zeros((u_hat.shape[0], 1, CAPS), ctx=x.context)
        for r in range(ROUTING):
            c = nd.softmax(logits.reshape((-1, CLASSES, CAPS)), axis=1).reshape((-1, 1, CAPS))
            v = squash(nd.batch_dot(c, u_hat))                                       # (B*CLASSES, 1, DDIM)
            if r < ROUTING - 1:
                logits = logits + nd.batch_dot(v, u_hat, transpose_b=True)            # agreement
        v = v.reshape((-1, CLASSES, DDIM))
        masked = (v * nd.one_hot(y, CLASSES).expand_dims(2)).reshape((0, -1))
        return nd.sqrt((v ** 2).sum(axis=2) + 1e-8), self.decoder(masked)


def capsule_loss(lengths, recon, x, y):
    t = nd.one_hot(y, CLASSES)
    margin = (t * nd.relu(0.9 - lengths) ** 2 + 0.5 * (1 - t) * nd.relu(lengths - 0.1) ** 2).sum(axis=1)
    return margin + 0.0005 * ((recon - x.reshape((0, -1))) ** 2).sum(axis=1)


def strokes(n, rng):
    """Images of one of ten stroke patterns (a bar at one of five angles, thin or thick), shifted and noisy."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] - SIZE / 2
    y = rng.integers(0, CLASSES, n)
    angle = (y % 5)[:, None, None] * np.pi / 5
    width = np.where(y < 5, 1.5, 3.5)[:, None, None]
    dist = np.abs(np.cos(angle) * yy[None] - np.sin(angle) * xx[None] + rng.normal(0, 2, (n, 1, 1)))
    x = np.clip((dist < width) + 0.2 * rng.standard_normal((n, SIZE, SIZE)), 0, 1)
    return (255 * x[:, None]).astype(np.uint8), y.astype(np.float32)


kv = mx.kv.create("dist_sync")
mx.random.seed(11 + kv.rank)
rng = np.random.default_rng(kv.rank)
images, labels = strokes(8 * args.batch, rng)
dataset = gluon.data.ArrayDataset(nd.array(images), nd.array(labels)).transform_first(lambda img: img.astype("float32") / 255)
loader = gluon.data.DataLoader(dataset, batch_size=args.batch, shuffle=True, last_batch="discard")
net = CapsNet()
net.initialize(mx.init.Xavier())
schedule = mx.lr_scheduler.PolyScheduler(max_update=args.steps, base_lr=1e-3, pwr=2, final_lr=1e-5, warmup_steps=4)
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 1e-3, "lr_scheduler": schedule}, kvstore=kv)

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    step = 0
    while step < args.steps:
        for x, y in loader:
            with autograd.record():
                lengths, recon = net(x, y)
                loss = capsule_loss(lengths, recon, x, y)
            loss.backward()
            trainer.step(args.batch)
            prof.step()  # dagprof (3/3)
            step += 1
            if step == args.steps:
                break
accuracy = (lengths.argmax(axis=1) == y).mean().asscalar()
print(f"worker {kv.rank}: loss {loss.mean().asscalar():.4f} accuracy {accuracy:.3f}")
