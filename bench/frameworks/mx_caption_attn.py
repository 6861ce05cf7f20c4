"""A user's MXNet script: a small "Show, Attend and Tell" captioner (Xu et al. 2015, small: a convolutional encoder to
a 4x4 grid of features, an ``LSTMCell`` decoder that attends over the grid at every word with additive attention and
predicts the next word from its state and the attended context) describing synthetic 16x16 images of one or two
coloured shapes ("red disc left blue square right"), ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: only the encoder hybridized (``hybridize(static_alloc=True,
static_shape=True)``) while the decoder runs imperatively, unrolled word by word in a Python loop under
``autograd.record()`` (teacher forcing), the attention's per-location projection computed once per batch and added to
each step's projected state, the paper's doubly stochastic attention penalty (each location's attention summed over
the words should be near 1) added to a ``SoftmaxCrossEntropyLoss`` weighted by a padding mask, captions of different
lengths in one padded batch, an ``ArrayDataset`` for a ``DataLoader``, Adam on the servers, and a greedy decode of a
few images at the end. Run it under the launcher, which starts the scheduler, servers and workers::

    dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:8 -- python mx_caption_attn.py
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn, rnn

from dagprof.collect import mxnet_ps  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=32)
args = ap.parse_args()

SIZE, WORDS = 16, 9  # <s> + up to two (colour shape side) triples + </s>, padded
COLOURS, SHAPES = ["red", "green", "blue", "white"], ["disc", "square", "bar"]
VOCAB = ["<pad>", "<s>", "</s>", "left", "right"] + COLOURS + SHAPES
RGB = np.array([[1, 0.1, 0.1], [0.1, 1, 0.1], [0.2, 0.2, 1], [1, 1, 1]], np.float32)


def scenes(n, seed):
    """Images (n, 3, SIZE, SIZE) and their captions as word ids (n, WORDS), each ``<s> ... </s>`` then padding."""
    rng = np.random.default_rng(seed)
    img = 0.1 * rng.standard_normal((n, 3, SIZE, SIZE)).astype(np.float32)
    caps = np.zeros((n, WORDS), np.float32)
    yy, xx = np.mgrid[:SIZE, :SIZE]
    for i in range(n):
        words = ["<s>"]
        for side in (["left", "right"] if rng.random() < 0.5 else [["left", "right"][rng.integers(2)]]):
            c, s = int(rng.integers(len(COLOURS))), int(rng.integers(len(SHAPES)))
            cx, cy = (4 if side == "left" else 11) + rng.integers(-1, 2), 8 + rng.integers(-3, 4)
            mask = [(xx - cx) ** 2 + (yy - cy) ** 2 <= 9, (abs(xx - cx) <= 2) & (abs(yy - cy) <= 2),
                    (abs(xx - cx) <= 1) & (abs(yy - cy) <= 4)][s]
            img[i][:, mask] += RGB[c][:, None]
            words += [COLOURS[c], SHAPES[s], side]
        words.append("</s>")
        caps[i, :len(words)] = [VOCAB.index(w) for w in words]
    return img, caps


class Captioner(nn.Block):
    def __init__(self, hidden=128, att=64, **kwargs):
        super().__init__(**kwargs)
        self.encoder = nn.HybridSequential()
        for ch in (32, 64):
            self.encoder.add(nn.Conv2D(ch, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"), nn.MaxPool2D(2))
        self.embed = nn.Embedding(len(VOCAB), 64)
        self.cell = rnn.LSTMCell(hidden)
        self.att_feat, self.att_state = nn.Dense(att, flatten=False), nn.Dense(att)
        self.att_score = nn.Dense(1, flatten=False)
        self.init_h, self.init_c = nn.Dense(hidden, activation="tanh"), nn.Dense(hidden, activation="tanh")
        self.out = nn.Dense(len(VOCAB))

    def encode(self, img):
        feats = self.encoder(img)  # (B, 64, 4, 4)
        return feats.reshape((0, 0, -1)).transpose((0, 2, 1))  # (B, 16 locations, 64)

    def attend(self, feats, proj, h):
        score = self.att_score(nd.tanh(proj + self.att_state(h).expand_dims(1)))  # (B, 16, 1)
        alpha = nd.softmax(score, axis=1)
        return (alpha * feats).sum(axis=1), alpha[:, :, 0]

    def forward(self, img, words):
        feats = self.encode(img)
        proj, mean = self.att_feat(feats), feats.mean(axis=1)
        state = [self.init_h(mean), self.init_c(mean)]
        logits, alphas = [], []
        for t in range(words.shape[1] - 1):
            context, alpha = self.attend(feats, proj, state[0])
            h, state = self.cell(nd.concat(self.embed(words[:, t]), context, dim=1), state)
            logits.append(self.out(h))
            alphas.append(alpha)
        return nd.stack(*logits, axis=1), nd.stack(*alphas, axis=1)  # (B, T-1, V), (B, T-1, 16)

    def greedy(self, img):
        feats = self.encode(img)
        proj, mean = self.att_feat(feats), feats.mean(axis=1)
        state, word, said = [self.init_h(mean), self.init_c(mean)], nd.ones((img.shape[0],)), []
        for _ in range(WORDS - 1):
            context, _ = self.attend(feats, proj, state[0])
            h, state = self.cell(nd.concat(self.embed(word), context, dim=1), state)
            word = self.out(h).argmax(axis=1)
            said.append(word)
        return nd.stack(*said, axis=1).asnumpy().astype(int)


kv = mx.kv.create("dist_sync")
mx.random.seed(31 + kv.rank)
images, captions = scenes(args.batch * args.steps, seed=kv.rank)
loader = gluon.data.DataLoader(gluon.data.ArrayDataset(images, captions), batch_size=args.batch, shuffle=True, last_batch="discard")
net = Captioner()
net.initialize(init=mx.init.Xavier())
net.encoder.hybridize(static_alloc=True, static_shape=True)
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 3e-3}, kvstore=kv)
xent = gluon.loss.SoftmaxCrossEntropyLoss()

with mxnet_ps.profile(trainer, net) as prof:  # dagprof (2/3)
    step = 0
    while step < args.steps:
        for img, caps in loader:
            target, weight = caps[:, 1:], (caps[:, 1:] > 0)
            with autograd.record():
                logits, alphas = net(img, caps)
                words = xent(logits, target, weight.expand_dims(2)) * (WORDS - 1) / weight.sum(axis=1).clip(1, WORDS)
                penalty = ((1 - alphas.sum(axis=1)) ** 2).mean(axis=1)
                loss = words + 0.5 * penalty
            loss.backward()
            trainer.step(args.batch)
            prof.step()  # dagprof (3/3)
            step += 1
            if step % 4 == 0:
                print(f"worker {kv.rank} step {step}: loss {loss.mean().asscalar():.3f}", flush=True)
            if step == args.steps:
                break
test_img, test_caps = scenes(3, seed=99)
for said, truth in zip(net.greedy(nd.array(test_img)), test_caps.astype(int)):
    print(f"worker {kv.rank}: {' '.join(VOCAB[w] for w in said if w > 2)} | {' '.join(VOCAB[w] for w in truth if w > 2)}")
