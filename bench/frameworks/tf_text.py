"""A user's TensorFlow script: a text classifier (Embedding + Conv1D), custom loop, MultiWorkerMirroredStrategy.

Written as a new user would, with the three lines dagprof needs (marked). Run one process per worker
with TF_CONFIG set (bench/bench_frameworks.py does): ``python tf_text.py --out RUN``.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=36)
ap.add_argument("--batch", type=int, default=32)
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
VOCAB, LEN = 8000, 64
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input((LEN,), dtype="int32"),
        tf.keras.layers.Embedding(VOCAB, 64, name="embed"),
        tf.keras.layers.Conv1D(64, 5, activation="relu", name="conv"),
        tf.keras.layers.GlobalMaxPooling1D(name="pool"),
        tf.keras.layers.Dense(64, activation="relu", name="hidden"),
        tf.keras.layers.Dense(4, name="out"),
    ])
    opt = tf.keras.optimizers.Adam(1e-3)

rng = np.random.default_rng(0)
x = tf.constant(rng.integers(0, VOCAB, (args.batch, LEN)), dtype=tf.int32)
y = tf.constant(rng.integers(0, 4, args.batch), dtype=tf.int32)


@tf.function
def train_step(xs, ys):
    def replica_step(xs, ys):
        with tf.GradientTape() as tape:
            logits = model(xs, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(ys, logits, from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return strategy.run(replica_step, args=(xs, ys))


with tf_profile(args.out, steps=(6, 14), model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            train_step(x, y)
