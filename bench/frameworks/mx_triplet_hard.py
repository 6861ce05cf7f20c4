"""A user's MXNet script: metric learning with the batch-hard triplet loss (Hermans et al. 2017, "In Defense of the
Triplet Loss": every batch holds P identities with K examples each; each example is an anchor whose hardest positive,
the farthest example of its identity, and hardest negative, the closest of another, are mined inside the batch) on
synthetic 20x20 glyphs of 40 identities, ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: a ``gluon.data.Sampler`` subclass that yields P x K index
batches (given to the ``DataLoader`` as its ``batch_sampler``), a ``HybridBlock`` embedding network ending in
``L2Normalization`` and hybridized whole, the pairwise distance matrix and the hardest positives and negatives mined
with ``nd`` masks inside ``autograd.record()``, then ``gluon.loss.TripletLoss`` on the anchor and the two gathered
embeddings (``nd.take``), the fraction of active triplets logged, AdaDelta on the servers, and a recall@1 read on a
held-out batch at the end. Run it under the launcher, which starts the scheduler, servers and workers::

    dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:8 -- python mx_triplet_hard.py
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

from dagprof.collect import mxnet_ps  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--identities", type=int, default=8, help="P: identities in a batch")
ap.add_argument("--per-identity", type=int, default=4, help="K: examples of each in a batch")
args = ap.parse_args()

SIZE, IDS, MARGIN = 20, 40, 0.3


def glyphs(n_per, seed):
    """Each identity a fixed set of three random strokes; its examples shifted, thickened and noisy. (n, 1, SIZE, SIZE)."""
    shapes = np.random.default_rng(0).uniform(2, SIZE - 2, (IDS, 3, 4))
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:SIZE, :SIZE].astype(np.float32)
    labels = np.repeat(np.arange(IDS), n_per)
    shift = rng.uniform(-1.5, 1.5, (labels.size, 2, 1, 1))
    img = np.zeros((labels.size, SIZE, SIZE), np.float32)
    for s in range(3):
        y0, x0, y1, x1 = (shapes[labels, s, i][:, None, None] + shift[:, i % 2] for i in range(4))
        t = np.clip(((yy - y0) * (y1 - y0) + (xx - x0) * (x1 - x0)) / ((y1 - y0) ** 2 + (x1 - x0) ** 2 + 1e-3), 0, 1)
        dist = np.hypot(yy - (y0 + t * (y1 - y0)), xx - (x0 + t * (x1 - x0)))
        img = np.maximum(img, np.clip(rng.uniform(1.0, 2.0, (labels.size, 1, 1)) - dist, 0, 1))
    img += 0.15 * rng.standard_normal(img.shape).astype(np.float32)
    return img[:, None].astype(np.float32), labels.astype(np.float32)


class PKSampler(gluon.data.Sampler):
    """Batches of ``p`` identities with ``k`` examples each, identities drawn without replacement within a batch."""

    def __init__(self, labels, p, k, batches, seed):
        self.by_id = [np.flatnonzero(labels == i) for i in range(IDS)]
        self.p, self.k, self.batches, self.rng = p, k, batches, np.random.default_rng(seed)

    def __iter__(self):
        for _ in range(self.batches):
            ids = self.rng.choice(IDS, self.p, replace=False)
            yield np.concatenate([self.rng.choice(self.by_id[i], self.k, replace=False) for i in ids]).tolist()

    def __len__(self):
        return self.batches


class Embedder(nn.HybridBlock):
    def __init__(self, dim=64, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.features = nn.HybridSequential()
            for channels in (32, 64, 128):
                self.features.add(nn.Conv2D(channels, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"), nn.MaxPool2D(2))
            self.features.add(nn.Flatten(), nn.Dense(256, activation="relu"), nn.Dense(dim))

    def hybrid_forward(self, F, x):
        return F.L2Normalization(self.features(x))


def hardest(emb, labels):
    """Per anchor, the index of its farthest positive and of its closest negative in the batch."""
    sq = (emb ** 2).sum(axis=1)
    dist = (sq.expand_dims(1) + sq.expand_dims(0) - 2 * nd.dot(emb, emb.T)).clip(0, 4)
    same = labels.expand_dims(1) == labels.expand_dims(0)
    positive = nd.argmax(dist * same - 10 * nd.eye(len(labels), ctx=emb.context), axis=1)
    negative = nd.argmin(dist + 10 * same, axis=1)
    return positive, negative


kv = mx.kv.create("dist_sync")
mx.random.seed(51 + kv.rank)
images, labels = glyphs(12, seed=kv.rank)
sampler = PKSampler(labels, args.identities, args.per_identity, args.steps, seed=kv.rank)
loader = gluon.data.DataLoader(gluon.data.ArrayDataset(images, labels), batch_sampler=sampler)
net = Embedder()
net.initialize(init=mx.init.Xavier(magnitude=2.0))
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "adadelta", {"rho": 0.9, "epsilon": 1e-6, "learning_rate": 1.0}, kvstore=kv)
triplet = gluon.loss.TripletLoss(margin=MARGIN)
batch = args.identities * args.per_identity

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    for step, (img, lab) in enumerate(loader, start=1):
        with autograd.record():
            emb = net(img)
            positive, negative = hardest(emb.detach(), lab)
            loss = triplet(emb, nd.take(emb, positive), nd.take(emb, negative))
        loss.backward()
        trainer.step(batch)
        prof.step()  # dagprof (3/3)
        if step % 4 == 0:
            active = (loss > 0).mean().asscalar()
            print(f"worker {kv.rank} step {step}: loss {loss.mean().asscalar():.3f}, active triplets {active:.2f}", flush=True)
test_img, test_lab = glyphs(2, seed=100 + kv.rank)
emb = net(nd.array(test_img))
dist = nd.dot(emb, emb.T) * -1 + 10 * nd.eye(len(test_lab))
recall = (test_lab[nd.argmin(dist, axis=1).asnumpy().astype(int)] == test_lab).mean()
print(f"worker {kv.rank}: recall@1 {recall:.2f}", flush=True)
