"""A user's TensorFlow script: a GRU sequence classifier over an embedding, Keras ``fit`` under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: a recurrent layer (``GRU``: a while-loop in the graph), several
epochs of a few ``steps_per_epoch`` each with ``validation_data`` evaluated at every epoch's end (the profiled window,
``steps=(6, 14)``: 8 steps, as in every script here, straddles the first epoch's validation), Keras callbacks of the user's own beside
dagprof's (a learning-rate schedule, a metrics logger), ``accuracy`` as a compiled metric and Adam.
Needs tf-keras and TF_USE_LEGACY_KERAS=1. ``python tf_gru_fit.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from dagprof.collect.hooks.tf_profile import keras_callback  # noqa: E402  (dagprof)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--steps-per-epoch", type=int, default=8)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seq", type=int, default=40, help="tokens per sequence (GRU steps)")
args = ap.parse_args()

VOCAB, LEN = 5000, args.seq
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input((LEN,), dtype="int32"),
        tf.keras.layers.Embedding(VOCAB, 48, name="tokens"),
        tf.keras.layers.GRU(64, name="gru"),
        tf.keras.layers.Dropout(0.1, name="drop"),
        tf.keras.layers.Dense(32, activation="relu", name="head"),
        tf.keras.layers.Dense(3, name="classes"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(2e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

rng = np.random.default_rng(3)
n = args.batch * strategy.num_replicas_in_sync
opts = tf.data.Options()
opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA


def dataset(size: int) -> tf.data.Dataset:
    x, y = rng.integers(0, VOCAB, (size, LEN)).astype(np.int32), rng.integers(0, 3, size)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(size, seed=0).batch(n).repeat().with_options(opts)


class Logger(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if int(os.environ.get("TF_CONFIG", "{}").count('"index": 0')):
            print(f"epoch {epoch}: {logs}", flush=True)


model.fit(dataset(4 * n), validation_data=dataset(2 * n), validation_steps=2, epochs=args.epochs,
          steps_per_epoch=args.steps_per_epoch, verbose=0,
          callbacks=[tf.keras.callbacks.LearningRateScheduler(lambda e, lr: lr * 0.9), Logger(),
                     keras_callback(args.out, steps=(6, 14))])  # dagprof
