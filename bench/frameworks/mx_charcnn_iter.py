"""A user's MXNet script: a character-level CNN text classifier (Zhang, Zhao & LeCun 2015, small: a character
Embedding, three Conv1D layers with max-pooling, a Dense layer with Dropout, a Dense head) on synthetic "news" text
whose class sets which characters are frequent, hybridized, ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: batches from a custom ``mx.io.DataIter`` subclass
(``provide_data`` / ``provide_label`` as ``DataDesc``, ``next()`` returning an ``mx.io.DataBatch``, ``reset()``
at each epoch's end, a ``pad`` on the last batch of an epoch), the text quantised to character ids by a numpy
lookup table, ``gluon.nn.HybridSequential`` built in a loop, RMSProp on the servers (``gluon.Trainer(...,
kvstore="dist_sync")``), and the loss averaged with ``mx.metric.Loss``. The dagprof lines are marked. Run it
under the launcher (``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_charcnn_iter.py``).
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from dagprof.collect import mxnet_ps  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=32)
args = ap.parse_args()

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789-,;.!?:'\"/\\|_@#$%^&*~`+=<>()[]{} "
LEN, CLASSES = 128, 4
LOOKUP = np.zeros(256, np.float32)  # byte -> character id (0: unknown)
for i, c in enumerate(ALPHABET):
    LOOKUP[ord(c)] = i + 1


class CharIter(mx.io.DataIter):
    """Endless synthetic documents, a class per document: each class draws its characters from its own distribution."""

    def __init__(self, batch_size, docs, seed):
        super().__init__(batch_size)
        rng = np.random.default_rng(seed)
        probs = rng.dirichlet(np.full(len(ALPHABET), 0.3), CLASSES)
        self.labels = rng.integers(0, CLASSES, docs)
        letters = np.array(list(ALPHABET))
        self.texts = ["".join(rng.choice(letters, LEN, p=probs[y])) for y in self.labels]
        self.cursor = 0

    @property
    def provide_data(self):
        return [mx.io.DataDesc("chars", (self.batch_size, LEN))]

    @property
    def provide_label(self):
        return [mx.io.DataDesc("label", (self.batch_size,))]

    def reset(self):
        self.cursor = 0

    def next(self):
        if self.cursor >= len(self.texts):
            raise StopIteration
        idx = np.arange(self.cursor, self.cursor + self.batch_size) % len(self.texts)
        pad = max(0, self.cursor + self.batch_size - len(self.texts))
        self.cursor += self.batch_size
        chars = LOOKUP[np.frombuffer("".join(self.texts[i] for i in idx).encode(), np.uint8)].reshape(self.batch_size, LEN)
        return mx.io.DataBatch([mx.nd.array(chars)], [mx.nd.array(self.labels[idx])], pad=pad)


net = gluon.nn.HybridSequential()
with net.name_scope():
    net.add(gluon.nn.Embedding(len(ALPHABET) + 1, 32))
    net.add(gluon.nn.HybridLambda(lambda F, x: F.transpose(x, axes=(0, 2, 1))))  # (batch, channels, time)
    for channels, width, pool in ((128, 7, 3), (128, 7, 3), (128, 3, 0)):
        net.add(gluon.nn.Conv1D(channels, width, activation="relu"))
        if pool:
            net.add(gluon.nn.MaxPool1D(pool))
    net.add(gluon.nn.GlobalMaxPool1D(), gluon.nn.Flatten(), gluon.nn.Dense(256, activation="relu"), gluon.nn.Dropout(0.5),
            gluon.nn.Dense(CLASSES))
mx.random.seed(11)
net.initialize(mx.init.Normal(0.05))
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "rmsprop", {"learning_rate": 1e-3, "gamma1": 0.95}, kvstore="dist_sync")
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
data = CharIter(args.batch, docs=args.batch * 5 + 7, seed=21)
avg = mx.metric.Loss()

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        try:
            batch = data.next()
        except StopIteration:
            data.reset()
            batch = data.next()
        x, y = batch.data[0], batch.label[0]
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(args.batch)
        avg.update(None, [loss])
        prof.step()  # dagprof (3/3)
        if step % 5 == 4:
            print(f"step {step}: {avg.get()[0]} {avg.get()[1]:.3f}", flush=True)
