"""A user's MXNet script: a bag-of-words text classifier (Embedding, mean over tokens, 2 Dense), SGD with
momentum on the servers, ``dist_sync``.

As a new user writes it (``loss.backward(); trainer.step()``, no ``waitall``), with the lines dagprof
needs (marked). The embedding's gradient is dense (``sparse_grad`` off, Gluon's default), 2 MB per step.

    python -m dagprof.collect.hooks.mxnet_ps run --out RUN --servers 1 --workers 2 -- python mx_embed.py
"""
import argparse

import mxnet as mx
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

VOCAB, DIM, LEN = 8000, 64, 48


class BagOfWords(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(VOCAB, DIM)
            self.hidden = gluon.nn.Dense(128, activation="relu")
            self.out = gluon.nn.Dense(4)

    def hybrid_forward(self, F, tokens):
        return self.out(self.hidden(F.mean(self.embed(tokens), axis=1)))


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=14)
ap.add_argument("--batch", type=int, default=64)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
mx.random.seed(7 + kv.rank)
net = BagOfWords()
net.initialize(mx.init.Xavier())
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9}, kvstore=kv)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
tokens = nd.random.randint(0, VOCAB, shape=(args.batch, LEN)).astype("float32")
labels = nd.array([i % 4 for i in range(args.batch)])

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for _ in range(args.steps):
        with autograd.record():
            loss = loss_fn(net(tokens), labels)
        loss.backward()
        trainer.step(args.batch)
        prof.step()  # dagprof (3/3)
print(f"worker {kv.rank}: loss {loss.mean().asscalar():.3f}")
