"""A user's TensorFlow script: an FT-Transformer (Gorishniy et al. 2021, small) classifying synthetic tabular rows:
each of 24 numeric features tokenised by its own learned scale and bias (no lookup table), a [CLS] token, two pre-norm
transformer blocks (``MultiHeadAttention``, GELU feed-forward), a head on [CLS]; a custom loop under
MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: the replica step's forward and backward under
``tf.function(jit_compile=True)`` (XLA compiles the gradient computation; the optimizer's all-reduce and update stay
outside it, as collectives inside an XLA cluster are not what TF compiles on CPU), a ``tf.data`` pipeline that
standardises features in ``map`` with ``num_parallel_calls=AUTOTUNE`` and ends in ``prefetch(AUTOTUNE)``, handed to
``strategy.experimental_distribute_dataset`` (the global batch split over the workers), ``CategoricalCrossentropy``
with ``label_smoothing=0.1`` on one-hot labels and ``reduction=NONE`` scaled by ``compute_average_loss``, AdamW with a
cosine-decay schedule object, and a ``tf.keras.metrics.CategoricalAccuracy`` updated in the replica step and read every 8 steps by every worker
(its read all-reduces; worker 0 prints). ``python tf_fttransformer_xla.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=64, help="per worker")
ap.add_argument("--window", default="6:14", help="the profiled steps A:B")
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
FEATURES, CLASSES, DIM, HEADS, BLOCKS = 24, 5, 64, 4, 2
GLOBAL_BATCH = args.batch * strategy.num_replicas_in_sync


class FeatureTokenizer(tf.keras.layers.Layer):
    """x (batch, F) -> (batch, F + 1, D): feature f's token is x_f * W_f + b_f; a learned [CLS] token first."""

    def build(self, shape):
        self.w = self.add_weight(name="w", shape=(FEATURES, DIM), initializer="glorot_uniform")
        self.b = self.add_weight(name="b", shape=(FEATURES, DIM), initializer="zeros")
        self.cls = self.add_weight(name="cls", shape=(1, 1, DIM), initializer="glorot_uniform")

    def call(self, x):
        tokens = x[:, :, None] * self.w + self.b
        return tf.concat([tf.tile(self.cls, [tf.shape(x)[0], 1, 1]), tokens], axis=1)


class Block(tf.keras.layers.Layer):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.n1, self.n2 = tf.keras.layers.LayerNormalization(), tf.keras.layers.LayerNormalization()
        self.att = tf.keras.layers.MultiHeadAttention(HEADS, DIM // HEADS, dropout=0.1)
        self.ff1 = tf.keras.layers.Dense(2 * DIM, activation="gelu")
        self.ff2 = tf.keras.layers.Dense(DIM)

    def call(self, h, training=False):
        x = self.n1(h)
        h = h + self.att(x, x, training=training)
        return h + self.ff2(self.ff1(self.n2(h)))


class FTTransformer(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.tok = FeatureTokenizer()
        self.blocks = [Block(name=f"block{i}") for i in range(BLOCKS)]
        self.norm = tf.keras.layers.LayerNormalization()
        self.head = tf.keras.layers.Dense(CLASSES)

    def call(self, x, training=False):
        h = self.tok(x)
        for b in self.blocks:
            h = b(h, training=training)
        return self.head(tf.nn.relu(self.norm(h[:, 0])))


def make_dataset():
    """Rows whose class is set by a few nonlinear feature interactions; standardised in the pipeline."""
    rng = np.random.default_rng(11)
    n = GLOBAL_BATCH * 8
    x = rng.standard_normal((n, FEATURES)).astype(np.float32) * rng.uniform(0.5, 4, FEATURES).astype(np.float32)
    score = np.stack([x[:, 0] * x[:, 1], np.sin(x[:, 2]), x[:, 3] ** 2 - x[:, 4], x[:, 5] + x[:, 6] * x[:, 7], -x[:, 8]], 1)
    y = np.argmax(score, 1).astype(np.int32)
    mean, std = x.mean(0), x.std(0)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=1).repeat()
    ds = ds.map(lambda f, c: ((f - mean) / std, tf.one_hot(c, CLASSES)), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(GLOBAL_BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


with strategy.scope():
    model = FTTransformer()
    model(tf.zeros((1, FEATURES)))
    schedule = tf.keras.optimizers.schedules.CosineDecay(1e-3, decay_steps=args.steps, alpha=0.1)
    opt = tf.keras.optimizers.AdamW(schedule, weight_decay=1e-4)
    accuracy = tf.keras.metrics.CategoricalAccuracy()
loss_obj = tf.keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1,
                                                   reduction=tf.keras.losses.Reduction.NONE)
iterator = iter(strategy.experimental_distribute_dataset(make_dataset()))


@tf.function(jit_compile=True)
def loss_and_grads(x, y):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = tf.nn.compute_average_loss(loss_obj(y, logits), global_batch_size=GLOBAL_BATCH)
    return loss, logits, tape.gradient(loss, model.trainable_variables)


def replica_step(x, y):
    loss, logits, grads = loss_and_grads(x, y)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    accuracy.update_state(y, logits)
    return loss


@tf.function
def train_step(it):
    x, y = next(it)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(x, y)), axis=None)


with tf_profile(args.out, steps=args.window, model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            loss = train_step(iterator)
        if step % 8 == 7:
            acc = float(accuracy.result())  # a sync-on-read metric: reading it all-reduces, so every worker reads it
            if strategy.cluster_resolver.task_id == 0:
                print(f"step {step}: loss {float(loss):.3f} accuracy {acc:.3f}", flush=True)
