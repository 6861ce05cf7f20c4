"""A user's MXNet script: a DeepFM click-through model (Guo et al. 2017, small: 10 categorical fields hashed into one
shared 20,000 x 16 ``Embedding``, a first-order weight per feature from a second 20,000 x 1 table, the FM pairwise term
by the sum-square trick, a 3-layer MLP over the concatenated field vectors, the three summed into a logit) on synthetic
click logs, ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: a ``gluon.data.DataLoader`` with ``num_workers=2`` (worker
*processes* forked inside a dist worker, batches through shared memory: ``cpu_shared``, moved with ``as_in_context``) over a dataset of the
worker's own shard (``gluon.data.SimpleDataset`` built per ``kv.rank``), two tables of one hashed feature space (the
FM trick's ``square(sum) - sum(square)`` over the field axis), ``SigmoidBinaryCrossEntropyLoss``, the ``ftrl`` optimizer
(the click models' one) run by the servers, ``hybridize(static_alloc=True)``, and an ``mx.metric.Accuracy`` fed from
thresholded probabilities every step (the metric reads the output back: a sync point each step). The dagprof lines are
marked. Run it under the launcher (``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python
mx_deepfm_workers.py``).
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

FIELDS, HASH, K = 10, 20000, 16


class DeepFM(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(HASH, K)
            self.linear = gluon.nn.Embedding(HASH, 1)
            self.bias = self.params.get("bias", shape=(1,), init=mx.init.Zero())
            self.deep = gluon.nn.HybridSequential()
            self.deep.add(gluon.nn.Dense(200, activation="relu"), gluon.nn.Dense(200, activation="relu"), gluon.nn.Dense(1))

    def hybrid_forward(self, F, ids, bias):
        v = self.embed(ids)  # (batch, fields, K)
        first = F.sum(self.linear(ids), axis=(1, 2))
        fm = 0.5 * F.sum(F.square(F.sum(v, axis=1)) - F.sum(F.square(v), axis=1), axis=1)
        deep = F.reshape(self.deep(F.flatten(v)), (-1,))
        return F.broadcast_add(first + fm + deep, bias)


def click_logs(rank, n):
    """Hashed ids per field (Zipf-skewed inside each field's range) and a click drawn from a hidden logit."""
    rng = np.random.default_rng(100 + rank)
    per = HASH // FIELDS
    ids = (np.minimum(rng.zipf(1.3, (n, FIELDS)), per) - 1 + per * np.arange(FIELDS)).astype(np.float32)
    hidden = np.sin(ids).sum(1) / 2
    clicks = (rng.random(n) < 1 / (1 + np.exp(-hidden))).astype(np.float32)
    return list(zip(ids, clicks))


if __name__ == "__main__":  # the loader's worker processes must not rerun the job's setup
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--loader-workers", type=int, default=2)
    args = ap.parse_args()

    kv = mx.kv.create("dist_sync")
    mx.random.seed(3)
    ctx = mx.cpu()
    data = gluon.data.SimpleDataset(click_logs(kv.rank, args.batch * 8))
    loader = gluon.data.DataLoader(data, batch_size=args.batch, shuffle=True, last_batch="discard",
                                   num_workers=args.loader_workers, pin_memory=False)

    net = DeepFM()
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True)
    trainer = gluon.Trainer(net.collect_params(), "ftrl", {"learning_rate": 0.05, "lamda1": 1e-4}, kvstore=kv)
    loss_fn = gluon.loss.SigmoidBinaryCrossEntropyLoss()
    metric = mx.metric.Accuracy()

    step = 0
    with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
        while step < args.steps:
            for ids, clicks in loader:
                ids, clicks = ids.as_in_context(ctx), clicks.as_in_context(ctx)  # the workers' batches are on cpu_shared
                with autograd.record():
                    logit = net(ids)
                    loss = loss_fn(logit, clicks)
                loss.backward()
                trainer.step(args.batch)
                prof.step()  # dagprof (3/3)
                metric.update([clicks], [nd.sigmoid(logit) > 0.5])
                step += 1
                if step % 5 == 0 and kv.rank == 0:
                    print(f"step {step} loss {loss.mean().asscalar():.4f} {metric.get()}", flush=True)
                if step >= args.steps:
                    break
    print(f"worker {kv.rank}: done")
