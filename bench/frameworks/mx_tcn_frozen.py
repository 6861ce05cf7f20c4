"""A user's MXNet script: a temporal convolutional network (Bai et al. 2018, small: residual blocks of two dilated
causal ``Conv1D`` layers each, dilations 1, 2, 4, 8, a 1x1 projection where the width changes) forecasting the next
value of synthetic electricity-like series from a 64-step window, a per-series embedding (pretrained, kept frozen)
added to the input channels, ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: causality by left padding then cropping
(``Conv1D(padding=(k-1)*d)`` and a slice), a frozen parameter (``grad_req = "null"`` on the series embedding, as when
a pretrained table is kept) with the Trainer given only the trainable ones by a regular expression
(``net.collect_params(".*conv.*|.*dense.*")``), the kvstore created explicitly and handed to the Trainer, SGD with
``momentum``, ``clip_gradient`` and a ``FactorScheduler`` run on the servers, an L1 loss, ``trainer.step(...,
ignore_stale_grad=True)``. Run it under the launcher, which starts the scheduler, servers and workers::

    python -m dagprof.collect.hooks.mxnet_ps run --out RUN --servers 1 --workers 2 -- python mx_tcn_frozen.py
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

WINDOW, SERIES, EMB, KERNEL = 64, 50, 8, 3


class CausalBlock(gluon.HybridBlock):
    """Two dilated causal convolutions with ReLU and Dropout, a residual (1x1 projection where the width changes)."""

    def __init__(self, cin, cout, dilation, **kw):
        super().__init__(**kw)
        self.crop = (KERNEL - 1) * dilation
        with self.name_scope():
            self.conv1 = gluon.nn.Conv1D(cout, KERNEL, padding=self.crop, dilation=dilation, in_channels=cin)
            self.conv2 = gluon.nn.Conv1D(cout, KERNEL, padding=self.crop, dilation=dilation, in_channels=cout)
            self.drop = gluon.nn.Dropout(0.1)
            self.proj = gluon.nn.Conv1D(cout, 1, in_channels=cin) if cin != cout else None

    def hybrid_forward(self, F, x):
        h = self.drop(F.relu(F.slice_axis(self.conv1(x), axis=2, begin=0, end=-self.crop)))
        h = self.drop(F.relu(F.slice_axis(self.conv2(h), axis=2, begin=0, end=-self.crop)))
        return F.relu(h + (self.proj(x) if self.proj is not None else x))


class TCN(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.series = gluon.nn.Embedding(SERIES, EMB)
            self.blocks = gluon.nn.HybridSequential()
            for i, (cin, cout) in enumerate([(1 + EMB, 32), (32, 32), (32, 48), (48, 48)]):
                self.blocks.add(CausalBlock(cin, cout, 2 ** i))
            self.dense = gluon.nn.Dense(1, flatten=False)

    def hybrid_forward(self, F, x, sid):
        e = F.broadcast_like(F.expand_dims(self.series(sid), axis=2), F.slice_axis(x, axis=1, begin=0, end=1),
                             lhs_axes=(2,), rhs_axes=(2,))
        h = self.blocks(F.concat(x, e, dim=1))
        return F.reshape(self.dense(F.transpose(F.slice_axis(h, axis=2, begin=-1, end=None), axes=(0, 2, 1))), (-1,))


kv = mx.kv.create("dist_sync")
mx.random.seed(7 + kv.rank)
rng = np.random.default_rng(kv.rank)
net = TCN()
net.initialize(mx.init.Xavier())
net.series.weight.set_data(nd.array(rng.standard_normal((SERIES, EMB)) * 0.1))  # "pretrained": loaded, not learned
net.series.weight.grad_req = "null"
net.hybridize()
schedule = mx.lr_scheduler.FactorScheduler(step=8, factor=0.7, base_lr=0.05)
trainer = gluon.Trainer(net.collect_params(".*conv.*|.*dense.*"), "sgd",
                        {"learning_rate": 0.05, "momentum": 0.9, "clip_gradient": 1.0, "lr_scheduler": schedule}, kvstore=kv)
loss_fn = gluon.loss.L1Loss()


def windows(n):
    """Daily-and-weekly seasonal series with a per-series level and noise; the target is the next value."""
    sid = rng.integers(0, SERIES, n)
    t0 = rng.integers(0, 1000, n)[:, None] + np.arange(WINDOW + 1)[None]
    level = 1 + (sid % 7)[:, None] / 7
    y = level * (1 + 0.5 * np.sin(2 * np.pi * t0 / 24) + 0.2 * np.sin(2 * np.pi * t0 / 168)) + 0.05 * rng.standard_normal(t0.shape)
    return nd.array(y[:, None, :WINDOW]), nd.array(sid), nd.array(y[:, WINDOW])


data = [windows(args.batch) for _ in range(4)]
with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        x, sid, y = data[step % len(data)]
        with autograd.record():
            loss = loss_fn(net(x, sid), y)
        loss.backward()
        trainer.step(args.batch, ignore_stale_grad=True)
        prof.step()  # dagprof (3/3)
print(f"worker {kv.rank}: L1 {loss.mean().asscalar():.3f} lr {trainer.learning_rate:.4f}")
