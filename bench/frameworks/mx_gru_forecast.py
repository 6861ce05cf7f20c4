"""A user's MXNet script: a multivariate time-series forecaster (a per-step input projection, a ``gluon.rnn.GRUCell``
unrolled over the window, a Dense head predicting the next ``HORIZON`` values of every series), ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: a recurrent cell ``unroll``-ed by hand (``GRUCell``, not the
fused ``rnn.GRU`` op) in a block hybridized with ``static_alloc=True, static_shape=True``, a frozen input projection
(its parameters' ``grad_req = "null"``, as when it is loaded pretrained: those keys are never pushed), a larger
learning rate on the head (``lr_mult = 2``), ``HuberLoss``, the LAMB optimizer with a ``CosineScheduler`` run on the
servers, the kvstore made by the user (``mx.kv.create``) and handed to the ``Trainer``, a ``gluon.data.DataLoader`` over
an ``ArrayDataset`` (``last_batch="discard"``, shuffled) cycled over epochs, and the parameters saved by worker 0 at each
epoch's end (``save_parameters``).
The dagprof lines are marked. Run it under the launcher::

    dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_gru_forecast.py
"""
import argparse
import os
import tempfile

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

SERIES, WINDOW, HORIZON, HIDDEN, PROJ = 16, 24, 4, 96, 48


class Forecaster(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.proj = gluon.nn.Dense(PROJ, activation="tanh", flatten=False, in_units=SERIES)
            self.cell = gluon.rnn.GRUCell(HIDDEN, input_size=PROJ)
            self.head = gluon.nn.Dense(SERIES * HORIZON, in_units=HIDDEN)

    def hybrid_forward(self, F, x):
        outputs, _ = self.cell.unroll(WINDOW, self.proj(x), layout="NTC", merge_outputs=False)
        return self.head(outputs[-1]).reshape((0, HORIZON, SERIES))


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=32)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
rng = np.random.default_rng(17 + kv.rank)  # each worker its own series
t = np.arange(WINDOW + HORIZON)[None, :, None]
n = 6 * args.batch
series = np.sin(0.3 * t * rng.uniform(0.2, 1.0, (n, 1, SERIES)) + rng.uniform(0, 6.3, (n, 1, SERIES)))
series = (series + 0.1 * rng.standard_normal(series.shape)).astype(np.float32)
loader = gluon.data.DataLoader(gluon.data.ArrayDataset(series[:, :WINDOW], series[:, WINDOW:]), batch_size=args.batch,
                               shuffle=True, last_batch="discard")

net = Forecaster()
net.initialize(mx.init.Xavier())
net.proj.collect_params().setattr("grad_req", "null")  # "pretrained": frozen
net.head.collect_params().setattr("lr_mult", 2.0)
net.hybridize(static_alloc=True, static_shape=True)
schedule = mx.lr_scheduler.CosineScheduler(max_update=args.steps, base_lr=2e-3, final_lr=1e-4, warmup_steps=2)
trainer = gluon.Trainer(net.collect_params(), "lamb", {"learning_rate": 2e-3, "wd": 1e-4, "lr_scheduler": schedule}, kvstore=kv)
loss_fn = gluon.loss.HuberLoss(rho=0.5)
save_dir = tempfile.mkdtemp(prefix="forecast_")

step = 0
with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    while step < args.steps:
        for x, y in loader:
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(args.batch)
            if kv.rank == 0 and step % 4 == 0:
                print(f"step {step}: huber {loss.mean().asscalar():.4f} lr {trainer.learning_rate:.2e}", flush=True)
            prof.step()  # dagprof (3/3)
            step += 1
            if step >= args.steps:
                break
        if kv.rank == 0:
            net.save_parameters(os.path.join(save_dir, f"forecast-{step}.params"))
nd.waitall()
