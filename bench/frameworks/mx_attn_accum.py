"""A user's MXNet script: a hybridized self-attention encoder over sensor sequences (Dense projection, one
multi-head attention block written with ``batch_dot``, LayerNorm, mean pooling, Dense head), ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: ``gluon.Trainer(..., update_on_kvstore=False)`` (the
servers only sum: gradients are pulled back and SGD with momentum runs on every worker), gradient accumulation
over 2 micro-batches with ``grad_req='add'`` and ``zero_grad()`` after each step, batches from
``gluon.data.DataLoader`` over an ``ArrayDataset``, a custom ``HybridBlock``. The dagprof lines are marked. Run
it under the launcher::

    dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_attn_accum.py
"""
import argparse

import mxnet as mx
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

SEQ, FEAT, DIM, HEADS, CLASSES = 32, 24, 64, 4, 6


class SelfAttention(gluon.HybridBlock):
    def __init__(self, dim, heads, **kw):
        super().__init__(**kw)
        self.dim, self.heads = dim, heads
        with self.name_scope():
            self.qkv = gluon.nn.Dense(3 * dim, flatten=False)
            self.out = gluon.nn.Dense(dim, flatten=False)

    def hybrid_forward(self, F, x):
        q, k, v = F.split(self.qkv(x), num_outputs=3, axis=-1)

        def heads(t):  # (B, T, D) -> (B*H, T, D/H)
            t = F.reshape(t, shape=(0, 0, self.heads, -1)).transpose((0, 2, 1, 3))
            return F.reshape(t, shape=(-3, 0, 0))

        att = F.softmax(F.batch_dot(heads(q), heads(k), transpose_b=True) / (self.dim // self.heads) ** 0.5, axis=-1)
        ctx = F.batch_dot(att, heads(v))
        ctx = F.reshape(F.reshape(ctx, shape=(-4, -1, self.heads, 0, 0)).transpose((0, 2, 1, 3)), shape=(0, 0, -3))
        return self.out(ctx)


class Encoder(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.proj = gluon.nn.Dense(DIM, flatten=False)
            self.att = SelfAttention(DIM, HEADS)
            self.norm = gluon.nn.LayerNorm()
            self.ff = gluon.nn.Dense(DIM, flatten=False, activation="relu")
            self.head = gluon.nn.Dense(CLASSES)

    def hybrid_forward(self, F, x):
        h = self.proj(x)
        h = self.norm(h + self.att(h))
        return self.head(F.mean(self.ff(h), axis=1))


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=14)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
mx.random.seed(7 + kv.rank)
data = gluon.data.ArrayDataset(nd.random.normal(shape=(16 * args.batch, SEQ, FEAT)),
                               nd.random.randint(0, CLASSES, shape=(16 * args.batch,)).astype("float32"))
loader = gluon.data.DataLoader(data, batch_size=args.batch, shuffle=True, last_batch="discard")

net = Encoder()
net.initialize(mx.init.Xavier())
net.hybridize()
net.collect_params().setattr("grad_req", "add")
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9}, kvstore=kv, update_on_kvstore=False)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()


def micro_batches():
    while True:
        yield from loader


batches = micro_batches()
with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for _ in range(args.steps):
        for _ in range(args.accum):
            x, y = next(batches)
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
        trainer.step(args.accum * args.batch)
        net.collect_params().zero_grad()
        prof.step()  # dagprof (3/3)
print(f"worker {kv.rank}: loss {loss.mean().asscalar():.3f}")
