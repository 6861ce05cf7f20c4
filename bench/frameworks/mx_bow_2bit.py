"""A user's MXNet script: a bag-of-n-grams topic classifier (a dense ``gluon.nn.Embedding`` averaged over the tokens,
two Dense layers with LayerNorm, a Dense head) on synthetic token ids, imperative (not hybridized), ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: 2-bit gradient compression with its own threshold (1.0),
the exchange as one list push and one list pull a step (``kv.push(keys, grads)``, ``kv.pull(keys, outs)``, no
priorities), Adam on the servers with gradient clipping (``clip_gradient``), a dense embedding gradient that dominates
the bytes (a 12,000 x 64 table, 3 MB of values, 0.19 MB a push once compressed), weights initialised with
``Uniform``, and a loss read every step with ``.asnumpy()`` (a sync point of the user's own). Run it under the
launcher (``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_bow_2bit.py``).
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

VOCAB, DIM, TOKENS, TOPICS = 12_000, 64, 48, 20

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=64)
args = ap.parse_args()


class BagOfNgrams(gluon.Block):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(VOCAB, DIM)
            self.fc1 = gluon.nn.Dense(256, flatten=False)
            self.norm1 = gluon.nn.LayerNorm()
            self.fc2 = gluon.nn.Dense(256, flatten=False)
            self.norm2 = gluon.nn.LayerNorm()
            self.head = gluon.nn.Dense(TOPICS)

    def forward(self, tokens):
        h = self.embed(tokens).mean(axis=1)
        h = nd.relu(self.norm1(self.fc1(h)))
        h = nd.relu(self.norm2(self.fc2(h))) + h
        return self.head(h)


kv = mx.kv.create("dist_sync")
rng = np.random.default_rng(31 + kv.rank)
topics = rng.integers(0, TOPICS, args.batch)
# each topic favours its own slice of the vocabulary
tokens = (rng.integers(0, VOCAB // TOPICS, (args.batch, TOKENS)) + topics[:, None] * (VOCAB // TOPICS)) % VOCAB
x, y = nd.array(tokens), nd.array(topics)

mx.random.seed(3)
net = BagOfNgrams()
net.initialize(mx.init.Uniform(0.05))
net(x)
params = list(net.collect_params().values())
keys = list(range(len(params)))
kv.set_gradient_compression({"type": "2bit", "threshold": 1.0})
kv.set_optimizer(mx.optimizer.Adam(learning_rate=2e-3, clip_gradient=5.0, rescale_grad=1.0 / (args.batch * kv.num_workers)))
kv.init(keys, [p.data() for p in params])
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

with mxnet_ps.profile(kv, net, params=params) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        kv.push(keys, [p.grad() for p in params])
        kv.pull(keys, out=[p.data() for p in params])
        mean_loss = float(loss.mean().asnumpy())
        prof.step()  # dagprof (3/3)
        if kv.rank == 0 and step % 4 == 3:
            print(f"step {step}: loss {mean_loss:.4f}", flush=True)
print(f"worker {kv.rank}: done")
