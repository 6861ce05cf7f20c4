"""A user's MXNet script: a denoising autoencoder for anomaly scores on synthetic sensor vectors (Gaussian noise and
masking on the input, a Dense encoder with LayerNorm down to a 32-wide code, a mirrored Dense decoder), hybridized,
``dist_sync``.

Habits it exercises that the other MXNet scripts do not: ``hybridize(static_alloc=True, static_shape=True)``, a metric
of the user's own (an ``mx.metric.EvalMetric`` subclass: the 95th percentile of the reconstruction error, updated
every step with ``asnumpy()``, so each step waits for its forward), the biases and LayerNorm parameters exempt from
weight decay (``collect_params(".*bias|.*gamma|.*beta").setattr("wd_mult", 0.0)``), RMSProp with ``clip_gradient`` on
the servers, ``trainer.step(batch, ignore_stale_grad=True)``, and each worker's batches cut from numpy arrays by hand
and copied in with ``nd.array`` every step. Run it under the launcher
(``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_dae_metric.py``).
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=64)
args = ap.parse_args()

FEATURES, CODE = 256, 32


class ReconstructionP95(mx.metric.EvalMetric):
    """The 95th percentile of the per-example mean squared reconstruction error (what the alert threshold is set from)."""

    def __init__(self):
        super().__init__("recon_p95")

    def update(self, labels, preds):
        for x, y in zip(labels, preds):
            err = ((x.asnumpy() - y.asnumpy()) ** 2).mean(axis=1)
            self.sum_metric += float(np.percentile(err, 95))
            self.num_inst += 1


class DenoisingAE(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.encoder = gluon.nn.HybridSequential()
            self.encoder.add(gluon.nn.Dense(512), gluon.nn.LayerNorm(), gluon.nn.Activation("softrelu"),
                             gluon.nn.Dense(128, activation="relu"), gluon.nn.Dense(CODE))
            self.decoder = gluon.nn.HybridSequential()
            self.decoder.add(gluon.nn.Dense(128, activation="relu"), gluon.nn.Dense(512), gluon.nn.LayerNorm(),
                             gluon.nn.Activation("softrelu"), gluon.nn.Dense(FEATURES))

    def hybrid_forward(self, F, x):
        return self.decoder(self.encoder(x))


kv = mx.kv.create("dist_sync")
rng = np.random.default_rng(100 + kv.rank)
clean = rng.standard_normal((args.batch * 8, FEATURES)).astype(np.float32)

mx.random.seed(3)
net = DenoisingAE()
net.initialize(mx.init.Xavier(magnitude=2.0))
net.collect_params(".*bias|.*gamma|.*beta").setattr("wd_mult", 0.0)
net.hybridize(static_alloc=True, static_shape=True)
trainer = gluon.Trainer(net.collect_params(), "rmsprop", {"learning_rate": 0.002, "wd": 1e-4, "clip_gradient": 5.0}, kvstore=kv)
loss_fn = gluon.loss.L2Loss()
metric = ReconstructionP95()

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        start = (step * args.batch) % len(clean)
        x = clean[start:start + args.batch]
        noisy = (x + 0.3 * rng.standard_normal(x.shape)) * (rng.random(x.shape) > 0.1)
        x, noisy = nd.array(x), nd.array(noisy.astype(np.float32))
        with autograd.record():
            recon = net(noisy)
            loss = loss_fn(recon, x)
        loss.backward()
        trainer.step(args.batch, ignore_stale_grad=True)
        metric.update([x], [recon])
        prof.step()  # dagprof (3/3)
        if step % 4 == 3 and kv.rank == 0:
            name, value = metric.get()
            print(f"step {step}: loss {loss.mean().asscalar():.4f} {name} {value:.4f}", flush=True)
            metric.reset()
print(f"worker {kv.rank}: done")
