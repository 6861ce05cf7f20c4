"""A user's MXNet script: a TextCNN sentence classifier (an Embedding, three Conv1D branches of widths 3/4/5 run side
by side in a ``HybridConcurrent`` and max-pooled over time, Dropout, a Dense head) on synthetic token data,
hybridized, ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: the kvstore named by its string ``kvstore="dist_sync"`` (the
Trainer creates it itself at the first step: the script reads its rank from ``trainer._kvstore`` afterwards only to
log), a learning-rate schedule (``mx.lr_scheduler.MultiFactorScheduler`` with a warm-up, handed to the optimizer,
run by the servers as ``update_on_kvstore``), NAG momentum, batches from ``mx.io.NDArrayIter`` (reset at each epoch's
end), and the accuracy kept by ``mx.metric.Accuracy`` updated every step. The dagprof lines are marked. Run it under
the launcher (``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_textcnn_sched.py``).
Tried first and left out, as MXNet 1.9.1 itself fails them under ``dist_sync``: 2-bit compression
(``compression_params={"type": "2bit"}``: the Trainer exchanges dense gradients by ``pushpull``, which the dist kvstore
refuses under compression) and, with ``--sparse-grad``, ``Embedding(sparse_grad=True)`` on a dense table (the server
aborts copying the pushed rows, "copying size mismatch", and the workers' ps-lite checks abort them).
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from dagprof.collect import mxnet_ps  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--sparse-grad", action="store_true", help="a row-sparse embedding gradient (MXNet 1.9.1 aborts)")
args = ap.parse_args()

VOCAB, EMB, LEN, CLASSES = 5000, 64, 40, 5


class TextCNN(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(VOCAB, EMB, sparse_grad=args.sparse_grad)
            self.convs = gluon.contrib.nn.HybridConcurrent(axis=1)
            for width in (3, 4, 5):
                branch = gluon.nn.HybridSequential()
                branch.add(gluon.nn.Conv1D(96, width, activation="relu"), gluon.nn.GlobalMaxPool1D(), gluon.nn.Flatten())
                self.convs.add(branch)
            self.drop = gluon.nn.Dropout(0.5)
            self.head = gluon.nn.Dense(CLASSES)

    def hybrid_forward(self, F, tokens):
        x = self.embed(tokens).transpose((0, 2, 1))  # (batch, channels, time) for Conv1D
        return self.head(self.drop(self.convs(x)))


mx.random.seed(7)
net = TextCNN()
net.initialize(mx.init.Xavier())
net.hybridize()
sched = mx.lr_scheduler.MultiFactorScheduler(step=[8, 12], factor=0.5, base_lr=0.05, warmup_steps=3, warmup_begin_lr=0.01)
trainer = gluon.Trainer(net.collect_params(), "nag", {"learning_rate": 0.05, "momentum": 0.9, "lr_scheduler": sched},
                        kvstore="dist_sync")
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
rng = np.random.default_rng(0)
data = mx.io.NDArrayIter(rng.integers(0, VOCAB, (args.batch * 6, LEN)).astype("float32"),
                         rng.integers(0, CLASSES, args.batch * 6).astype("float32"), batch_size=args.batch, shuffle=True)
metric = mx.metric.Accuracy()

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for _ in range(args.steps):
        try:
            batch = next(data)
        except StopIteration:
            data.reset()
            batch = next(data)
        x, y = batch.data[0], batch.label[0]
        with autograd.record():
            out = net(x)
            loss = loss_fn(out, y)
        loss.backward()
        trainer.step(args.batch)
        metric.update([y], [out])
        prof.step()  # dagprof (3/3)
name, acc = metric.get()
print(f"worker {trainer._kvstore.rank}: loss {loss.mean().asscalar():.3f} {name} {acc:.3f}")
