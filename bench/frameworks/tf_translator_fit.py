"""A user's TensorFlow script: a small Transformer translator (the TensorFlow "Neural machine translation with a
Transformer and Keras" tutorial, small: token and sinusoidal position embeddings, one encoder layer of self-attention,
one decoder layer of causal self-attention and cross-attention over the encoder's output, a Dense over the target
vocabulary) learning a synthetic "language pair" (the target is the source reversed, each token mapped through a fixed
permutation, between start and end tokens), Keras ``fit`` under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: an encoder-decoder in a functional model of two inputs
(``(context, target_in)`` -> logits, as the tutorial's ``Transformer`` is called), masks carried from
``Embedding(mask_zero=True)`` into ``MultiHeadAttention`` (padding masks for the encoder and the cross-attention,
``use_causal_mask=True`` in the decoder), the tutorial's own masked loss and masked accuracy functions given to
``compile``, its ``CustomSchedule`` (a ``LearningRateSchedule`` subclass: the paper's warm-up then inverse square root)
into Adam with the paper's betas, and a ``tf.data`` pipeline that buckets sentence pairs by length with
``bucket_by_sequence_length(pad_to_bucket_boundary=True)`` and splits each into ``((context, target_in), target_out)``,
so the steps of one ``fit`` run on batches of three shapes. One line for dagprof: the callback.
``python tf_translator_fit.py --out RUN`` per worker, TF_CONFIG set; needs tf-keras and ``TF_USE_LEGACY_KERAS=1``.
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from dagprof.collect.hooks.tf_profile import keras_callback  # noqa: E402  (dagprof)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--steps-per-epoch", type=int, default=14)
ap.add_argument("--batch", type=int, default=32, help="per worker")
ap.add_argument("--window", default="16:24")
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
VOCAB, D_MODEL, HEADS, FF, START, END = 2000, 64, 4, 128, 1, 2
BOUNDARIES = [12, 20, 32]  # buckets of pairs up to 11, 19 and 31 tokens, each padded to its boundary (every length below the last)
GLOBAL = args.batch * strategy.num_replicas_in_sync
PERMUTE = np.random.default_rng(7).permutation(VOCAB - 3) + 3


def pairs(seed):
    rng = np.random.default_rng(seed)
    while True:
        n = int(np.clip(rng.lognormal(2.3, 0.45), 3, 29))
        src = rng.integers(3, VOCAB, n)
        tgt = np.concatenate([[START], PERMUTE[src[::-1] - 3], [END]])
        yield src.astype(np.int32), tgt.astype(np.int32)


def dataset(seed):
    ds = tf.data.Dataset.from_generator(lambda: pairs(seed), output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32)))
    ds = ds.bucket_by_sequence_length(lambda s, t: tf.shape(t)[0], BOUNDARIES, [GLOBAL] * (len(BOUNDARIES) + 1),
                                      pad_to_bucket_boundary=True, drop_remainder=True)
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.map(lambda s, t: ((s, t[:, :-1]), t[:, 1:])).prefetch(2).with_options(opts)


def positional_encoding(length, depth):
    pos, i = np.arange(length)[:, None], np.arange(depth // 2)[None, :] / (depth // 2)
    angle = pos / 10000 ** i
    return tf.constant(np.concatenate([np.sin(angle), np.cos(angle)], -1), tf.float32)


class PositionalEmbedding(tf.keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.embedding = tf.keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)
        self.pos = positional_encoding(64, D_MODEL)

    def compute_mask(self, *args, **kwargs):
        return self.embedding.compute_mask(*args, **kwargs)

    def call(self, x):
        x = self.embedding(x) * tf.math.sqrt(tf.cast(D_MODEL, tf.float32))
        return x + self.pos[tf.newaxis, :tf.shape(x)[1], :]


def feed_forward(x):
    y = tf.keras.layers.Dense(FF, activation="relu")(x)
    y = tf.keras.layers.Dropout(0.1)(tf.keras.layers.Dense(D_MODEL)(y))
    return tf.keras.layers.LayerNormalization()(x + y)


def build():
    context, target = tf.keras.Input((None,), dtype=tf.int32), tf.keras.Input((None,), dtype=tf.int32)
    x = PositionalEmbedding()(context)
    x = tf.keras.layers.LayerNormalization()(x + tf.keras.layers.MultiHeadAttention(HEADS, D_MODEL // HEADS, dropout=0.1)(query=x, value=x, key=x))
    enc = feed_forward(x)
    y = PositionalEmbedding()(target)
    y = tf.keras.layers.LayerNormalization()(
        y + tf.keras.layers.MultiHeadAttention(HEADS, D_MODEL // HEADS, dropout=0.1)(query=y, value=y, key=y, use_causal_mask=True))
    y = tf.keras.layers.LayerNormalization()(y + tf.keras.layers.MultiHeadAttention(HEADS, D_MODEL // HEADS, dropout=0.1)(query=y, value=enc, key=enc))
    logits = tf.keras.layers.Dense(VOCAB)(feed_forward(y))
    return tf.keras.Model([context, target], logits)


class CustomSchedule(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, d_model, warmup_steps=8):
        super().__init__()
        self.d_model, self.warmup_steps = tf.cast(d_model, tf.float32), warmup_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        return tf.math.rsqrt(self.d_model) * tf.math.minimum(tf.math.rsqrt(step), step * self.warmup_steps ** -1.5)


def masked_loss(label, pred):
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(label, pred)
    mask = tf.cast(label != 0, loss.dtype)
    return tf.reduce_sum(loss * mask) / tf.reduce_sum(mask)


def masked_accuracy(label, pred):
    match = tf.cast(label == tf.cast(tf.argmax(pred, axis=2), label.dtype), tf.float32)
    mask = tf.cast(label != 0, tf.float32)
    return tf.reduce_sum(match * mask) / tf.reduce_sum(mask)


with strategy.scope():
    model = build()
    model.compile(optimizer=tf.keras.optimizers.Adam(CustomSchedule(D_MODEL), beta_1=0.9, beta_2=0.98, epsilon=1e-9),
                  loss=masked_loss, metrics=[masked_accuracy])
history = model.fit(dataset(3), epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0,
                    callbacks=[keras_callback(args.out, steps=tuple(map(int, args.window.split(":"))))])  # dagprof
print(", ".join(f"{k} {v[-1]:.3f}" for k, v in history.history.items()), flush=True)
