"""A user's MXNet script: a tiny single-shot multibox detector (the TinySSD of "Dive into Deep Learning"'s MXNet
chapter, smaller: a base net of three down-sampling blocks, two more blocks and a global max pool, at each of the five
scales a 3x3 convolution predicting every anchor's class and one its box offsets) finding rectangles and discs on
synthetic 64x64 images, ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: anchors generated in the forward pass by
``nd.contrib.MultiBoxPrior`` at every scale, training targets assigned inside ``autograd.record()`` by
``nd.contrib.MultiBoxTarget`` (anchor-box matching by IoU, offsets and masks), the predictions of five scales flattened
and concatenated (``transpose`` + ``flatten`` + ``concat``), a loss of two parts (``SoftmaxCrossEntropyLoss`` over the
anchors' classes and ``L1Loss`` on the masked offsets), the tutorial's per-step metrics read with ``asscalar`` (a
synchronisation each step), a ``gluon.data.Dataset`` subclass drawing each example in ``__getitem__`` for a
``DataLoader``, SGD with weight decay on the servers, and blocks named by ``setattr`` in a loop (not hybridized, as the
tutorial). Run it under the launcher, which starts the scheduler, servers and workers::

    python -m dagprof.collect.hooks.mxnet_ps run --out RUN --servers 1 --workers 2 -- python mx_ssd_multibox.py
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

from dagprof.collect import mxnet_ps  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=16)
args = ap.parse_args()

SIZE, CLASSES, OBJECTS = 64, 2, 2
SIZES = [[0.2, 0.272], [0.37, 0.447], [0.54, 0.619], [0.71, 0.79], [0.88, 0.961]]
RATIOS = [[1, 2, 0.5]] * 5
ANCHORS = len(SIZES[0]) + len(RATIOS[0]) - 1


class Shapes(gluon.data.Dataset):
    """Each example drawn on request: up to two objects (class 0 a rectangle, 1 a disc) on noise, labels as
    (class, xmin, ymin, xmax, ymax) in [0, 1], -1 rows for absent objects."""

    def __init__(self, n, seed):
        self.n, self.seed = n, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(self.seed * 100003 + i)
        img = 0.1 * rng.standard_normal((3, SIZE, SIZE)).astype(np.float32)
        label = -np.ones((OBJECTS, 5), np.float32)
        yy, xx = np.mgrid[0:SIZE, 0:SIZE]
        for k in range(int(rng.integers(1, OBJECTS + 1))):
            w, h = rng.integers(12, 36, 2)
            x0, y0 = rng.integers(0, SIZE - w), rng.integers(0, SIZE - h)
            cls = int(rng.integers(0, CLASSES))
            inside = (xx >= x0) & (xx < x0 + w) & (yy >= y0) & (yy < y0 + h)
            if cls == 1:
                inside &= ((xx - x0 - w / 2) / (w / 2)) ** 2 + ((yy - y0 - h / 2) / (h / 2)) ** 2 <= 1
            img[:, inside] += rng.uniform(0.5, 1.0, (3, 1)).astype(np.float32)
            label[k] = [cls, x0 / SIZE, y0 / SIZE, (x0 + w) / SIZE, (y0 + h) / SIZE]
        return nd.array(img), nd.array(label)


def down_sample_blk(channels):
    blk = nn.Sequential()
    for _ in range(2):
        blk.add(nn.Conv2D(channels, kernel_size=3, padding=1), nn.BatchNorm(in_channels=channels), nn.Activation("relu"))
    blk.add(nn.MaxPool2D(2))
    return blk


def get_blk(i):
    if i == 0:
        blk = nn.Sequential()
        for channels in [8, 16, 32]:
            blk.add(down_sample_blk(channels))
        return blk
    return nn.GlobalMaxPool2D() if i == 4 else down_sample_blk(32)


def flatten_pred(pred):
    return pred.transpose((0, 2, 3, 1)).flatten()


class TinySSD(nn.Block):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        for i in range(5):
            setattr(self, f"blk_{i}", get_blk(i))
            setattr(self, f"cls_{i}", nn.Conv2D(ANCHORS * (CLASSES + 1), kernel_size=3, padding=1))
            setattr(self, f"bbox_{i}", nn.Conv2D(ANCHORS * 4, kernel_size=3, padding=1))

    def forward(self, x):
        anchors, cls_preds, bbox_preds = [], [], []
        for i in range(5):
            x = getattr(self, f"blk_{i}")(x)
            anchors.append(nd.contrib.MultiBoxPrior(x, sizes=SIZES[i], ratios=RATIOS[i]))
            cls_preds.append(flatten_pred(getattr(self, f"cls_{i}")(x)))
            bbox_preds.append(flatten_pred(getattr(self, f"bbox_{i}")(x)))
        cls_preds = nd.concat(*cls_preds, dim=1)
        return nd.concat(*anchors, dim=1), cls_preds.reshape((0, -1, CLASSES + 1)), nd.concat(*bbox_preds, dim=1)


cls_loss, bbox_loss = gluon.loss.SoftmaxCrossEntropyLoss(), gluon.loss.L1Loss()


def calc_loss(cls_preds, cls_labels, bbox_preds, bbox_labels, bbox_masks):
    return cls_loss(cls_preds, cls_labels) + bbox_loss(bbox_preds * bbox_masks, bbox_labels * bbox_masks)


kv = mx.kv.create("dist_sync")
mx.random.seed(21 + kv.rank)
loader = gluon.data.DataLoader(Shapes(args.batch * args.steps, seed=kv.rank), batch_size=args.batch, shuffle=True, last_batch="discard")
net = TinySSD()
net.initialize(init=mx.init.Xavier())
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.2, "wd": 5e-4}, kvstore=kv)

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    step = 0
    while step < args.steps:
        for x, y in loader:
            with autograd.record():
                anchors, cls_preds, bbox_preds = net(x)
                bbox_labels, bbox_masks, cls_labels = nd.contrib.MultiBoxTarget(anchors, y, cls_preds.transpose((0, 2, 1)))
                loss = calc_loss(cls_preds, cls_labels, bbox_preds, bbox_labels, bbox_masks)
            loss.backward()
            trainer.step(args.batch)
            prof.step()  # dagprof (3/3)
            cls_acc = (cls_preds.argmax(axis=-1) == cls_labels).mean().asscalar()
            bbox_mae = (nd.abs((bbox_labels - bbox_preds) * bbox_masks)).mean().asscalar()
            step += 1
            if step == args.steps:
                break
print(f"worker {kv.rank}: class accuracy {cls_acc:.3f}, box mae {bbox_mae:.2e}")
