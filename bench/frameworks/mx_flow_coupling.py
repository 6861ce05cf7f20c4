"""A user's MXNet script: a RealNVP-style normalizing flow (Dinh et al. 2017) fitted by maximum likelihood to a synthetic
16-dimensional mixture, ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: a density model with no labels, six affine coupling layers
alternating their masks, each a small ``gluon.nn.Sequential`` conditioner whose output is split into a tanh-bounded
log-scale and a shift, the log-determinant summed by hand into a Gaussian negative log-likelihood, imperative
(never hybridized) ``gluon.Block``s, many small keys (36 parameters, the largest 16 kB), RMSProp on the servers with
``clip_gradient`` as an optimizer parameter, a fresh minibatch drawn with numpy every step, and the loss read with
``asscalar`` every fourth step. The dagprof lines are marked. Run it under the launcher
(``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_flow_coupling.py``).
"""
import argparse
import math

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

DIM, LAYERS = 16, 6


class Coupling(gluon.Block):
    """x_b passes; x_a becomes x_a * exp(s(x_b)) + t(x_b), with ``parity`` choosing which half is which."""

    def __init__(self, parity, hidden=64, **kw):
        super().__init__(**kw)
        self.parity = parity
        with self.name_scope():
            self.net = gluon.nn.Sequential()
            self.net.add(gluon.nn.Dense(hidden, activation="relu"), gluon.nn.Dense(hidden, activation="relu"), gluon.nn.Dense(DIM))

    def forward(self, x):
        a, b = nd.split(x, num_outputs=2, axis=1)
        if self.parity:
            a, b = b, a
        s, t = nd.split(self.net(b), num_outputs=2, axis=1)
        s = nd.tanh(s)
        a = a * nd.exp(s) + t
        out = nd.concat(b, a, dim=1) if self.parity else nd.concat(a, b, dim=1)
        return out, nd.sum(s, axis=1)


class Flow(gluon.Block):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.layers = [Coupling(i % 2) for i in range(LAYERS)]
            for layer in self.layers:
                self.register_child(layer)

    def forward(self, x):
        logdet = nd.zeros((x.shape[0],), ctx=x.context)
        for layer in self.layers:
            x, ld = layer(x)
            logdet = logdet + ld
        return x, logdet


def sample(rng, n):
    """A mixture of 4 correlated Gaussians in 16 dimensions."""
    centres = np.random.default_rng(3).normal(0, 3, (4, DIM))
    mix = np.random.default_rng(4).normal(0, 0.4, (DIM, DIM))
    which = rng.integers(0, 4, n)
    return (centres[which] + rng.normal(0, 1, (n, DIM)) @ mix).astype("float32")


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=256)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
rng = np.random.default_rng(21 + kv.rank)
mx.random.seed(5)
flow = Flow()
flow.initialize(mx.init.Normal(0.02))
trainer = gluon.Trainer(flow.collect_params(), "rmsprop", {"learning_rate": 1e-3, "clip_gradient": 5.0}, kvstore=kv)
half_log_2pi = 0.5 * math.log(2 * math.pi)

with mxnet_ps.profile(trainer, flow) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        x = nd.array(sample(rng, args.batch))
        with autograd.record():
            z, logdet = flow(x)
            nll = nd.mean(0.5 * nd.sum(z * z, axis=1) + DIM * half_log_2pi - logdet)
        nll.backward()
        trainer.step(1)
        prof.step()  # dagprof (3/3)
        if kv.rank == 0 and step % 4 == 3:
            print(f"step {step}: nll {nll.asscalar():.3f}", flush=True)
print(f"worker {kv.rank}: done")
