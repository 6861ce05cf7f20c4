"""A user's MXNet script: a sequence tagger and classifier (Embedding, 1-layer ``gluon.rnn.LSTM``, two Dense heads),
hybridized, AdaGrad on the servers, ``dist_sync``.

Habits it exercises that ``mx_mlp``/``mx_embed`` do not: a recurrent layer (fused RNN operator), ``net.hybridize()``,
each worker taking its own shard of the data by ``kv.rank``/``kv.num_workers``, two losses recorded in one
``autograd.record()`` and back-propagated together (``autograd.backward([l1, l2])``), AdaGrad on the servers
(``update_on_kvstore``), ``trainer.step(batch)`` with no ``waitall``. The dagprof lines are marked. Run it under
the launcher (``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_lstm.py``).
"""
import argparse

import mxnet as mx
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

VOCAB, DIM, HIDDEN, LEN, TAGS, CLASSES = 5000, 48, 96, 24, 8, 3


class Tagger(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(VOCAB, DIM)
            self.lstm = gluon.rnn.LSTM(HIDDEN, layout="NTC")
            self.tag = gluon.nn.Dense(TAGS, flatten=False)
            self.cls = gluon.nn.Dense(CLASSES)

    def hybrid_forward(self, F, tokens):
        h = self.lstm(self.embed(tokens))
        return self.tag(h), self.cls(F.mean(h, axis=1))


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=14)
ap.add_argument("--batch", type=int, default=32)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
mx.random.seed(3)
all_tokens = nd.random.randint(0, VOCAB, shape=(8 * args.batch, LEN)).astype("float32")
all_tags = nd.random.randint(0, TAGS, shape=(8 * args.batch, LEN)).astype("float32")
all_cls = nd.random.randint(0, CLASSES, shape=(8 * args.batch,)).astype("float32")
shard = slice(kv.rank * len(all_tokens) // kv.num_workers, (kv.rank + 1) * len(all_tokens) // kv.num_workers)
tokens, tags, cls = all_tokens[shard], all_tags[shard], all_cls[shard]
n_batches = tokens.shape[0] // args.batch

net = Tagger()
net.initialize(mx.init.Xavier())
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "adagrad", {"learning_rate": 0.05}, kvstore=kv)
tag_loss = gluon.loss.SoftmaxCrossEntropyLoss(axis=-1)
cls_loss = gluon.loss.SoftmaxCrossEntropyLoss()

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        b = slice((step % n_batches) * args.batch, (step % n_batches + 1) * args.batch)
        with autograd.record():
            tag_out, cls_out = net(tokens[b])
            l1 = tag_loss(tag_out, tags[b])
            l2 = 0.5 * cls_loss(cls_out, cls[b])
        autograd.backward([l1, l2])
        trainer.step(args.batch)
        prof.step()  # dagprof (3/3)
print(f"worker {kv.rank}: tag loss {l1.mean().asscalar():.3f} cls loss {l2.mean().asscalar():.3f}")
