"""A user's MXNet script: a small conv net (3 Conv2D + BatchNorm + MaxPool blocks, GlobalAvgPool, Dense) on synthetic
32x32 images, a ``HybridBlock`` subclass hybridized, SGD with momentum and weight decay on the servers, ``dist_sync``.

Habits it exercises that ``mx_mlp``/``mx_embed`` do not: convolutions, ``hybridize(static_alloc=True)``, a
``gluon.data.DataLoader`` over an ``ArrayDataset`` sharded by ``kv.rank`` (``SplitSampler`` as in Gluon's
examples), ``trainer.step(batch)`` straight after ``loss.backward()`` with no ``waitall``, the loss read back
(``asscalar``) every few steps only. The dagprof lines are marked. Run it under the launcher, with 1 or 2 servers
(``dagprof profile --mxnet-ps servers=2,workers=2 -o RUN --steps 4:9 -- python mx_convnet.py``).
"""
import argparse

import mxnet as mx
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)


class ConvNet(gluon.HybridBlock):
    def __init__(self, classes=10, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.features = gluon.nn.HybridSequential()
            for ch in (32, 64, 128):
                self.features.add(gluon.nn.Conv2D(ch, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
                                  gluon.nn.MaxPool2D(2))
            self.pool = gluon.nn.GlobalAvgPool2D()
            self.out = gluon.nn.Dense(classes)

    def hybrid_forward(self, F, x):
        return self.out(self.pool(self.features(x)))


class SplitSampler(gluon.data.sampler.Sampler):
    """Gluon's example sampler: worker ``part`` of ``parts`` reads its own contiguous shard."""

    def __init__(self, length, parts, part):
        self.size = length // parts
        self.start = part * self.size

    def __iter__(self):
        return iter(range(self.start, self.start + self.size))

    def __len__(self):
        return self.size


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=14)
ap.add_argument("--batch", type=int, default=16)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
mx.random.seed(11)
images = nd.random.normal(shape=(64 * kv.num_workers, 3, 32, 32))
labels = nd.random.randint(0, 10, shape=(64 * kv.num_workers,)).astype("float32")
loader = gluon.data.DataLoader(gluon.data.ArrayDataset(images, labels), batch_size=args.batch, last_batch="discard",
                               sampler=SplitSampler(len(images), kv.num_workers, kv.rank))

net = ConvNet()
net.initialize(mx.init.Xavier())
net.hybridize(static_alloc=True)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}, kvstore=kv)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

step = 0
with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    while step < args.steps:
        for x, y in loader:
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(args.batch)
            prof.step()  # dagprof (3/3)
            step += 1
            if step % 5 == 0 and kv.rank == 0:
                print(f"step {step} loss {loss.mean().asscalar():.3f}", flush=True)
            if step >= args.steps:
                break
print(f"worker {kv.rank}: done")
