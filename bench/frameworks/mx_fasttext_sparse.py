"""A user's MXNet script: a fastText-style text classifier (word and hashed-bigram tables averaged over the sentence,
a hidden Dense layer, a Dense head) on synthetic Zipf-distributed token data, ``dist_sync``, the tables' gradients
row_sparse.

Habits it exercises that the other MXNet scripts do not: two large tables (60,000 and 100,000 rows of 48, both above
ps-lite's 1M-element bound, so a job with 2 servers cuts their rows by row-id range, and Zipf's frequent words all
fall into the first server's range), only the rows a batch touched pushed and pulled (``row_sparse``), Adam on the
servers updating only those rows (``lazy_update``), and the bigram ids hashed on the host with numpy each step.
``gluon.nn.Embedding(..., sparse_grad=True)`` is what a user tries first; MXNet 1.9.1's server aborts on its first
push ("copying size mismatch", whatever the table's size or the optimizer: a dense table takes no row_sparse push),
so the tables are ``gluon.contrib.nn.SparseEmbedding``, as MXNet's sparse examples write them (row_sparse weight and
gradient; a Trainer on them keeps the update on the kvstore). The dagprof lines are marked. Run it under the launcher::

    dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:7 -- python mx_fasttext_sparse.py
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

VOCAB, BUCKETS, DIM, LEN, CLASSES = 60000, 100000, 48, 48, 8


class FastText(gluon.Block):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.words = gluon.contrib.nn.SparseEmbedding(VOCAB, DIM)
            self.bigrams = gluon.contrib.nn.SparseEmbedding(BUCKETS, DIM)
            self.hidden = gluon.nn.Dense(128, activation="relu")
            self.head = gluon.nn.Dense(CLASSES)

    def forward(self, words, bigrams):
        # a SparseEmbedding takes one id per row: flatten, look up, fold back and average over the sentence
        w = self.words(words.reshape((-1,))).reshape((-1, LEN, DIM)).mean(axis=1)
        b = self.bigrams(bigrams.reshape((-1,))).reshape((-1, LEN - 1, DIM)).mean(axis=1)
        return self.head(self.hidden(nd.concat(w, b, dim=1)))


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=96)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
rng = np.random.default_rng(5 + kv.rank)
net = FastText()
net.initialize(mx.init.Uniform(0.05))
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.002, "rescale_grad": 1.0 / args.batch}, kvstore=kv)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        tokens = np.minimum(rng.zipf(1.3, (args.batch, LEN)) - 1, VOCAB - 1)
        bigram = (tokens[:, :-1] * 1_000_003 + tokens[:, 1:]) % BUCKETS
        label = nd.array(tokens[:, 0] % CLASSES)
        with autograd.record():
            loss = loss_fn(net(nd.array(tokens), nd.array(bigram)), label)
        loss.backward()
        trainer.step(1)  # the gradient's scale is the optimizer's rescale_grad (the kvstore starts before the first step)
        prof.step()  # dagprof (3/3)
        if step % 4 == 0 and kv.rank == 0:
            print(f"step {step}: loss {loss.mean().asscalar():.4f}", flush=True)
