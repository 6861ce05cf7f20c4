"""A user's TensorFlow script: a wide & deep recommender with attention over the user's recent items, a Keras
subclassed model that overrides ``train_step``, trained by ``fit`` under MultiWorkerMirroredStrategy.

Habits the other TF scripts lack: a subclassed ``tf.keras.Model`` (layers built in ``__init__``, ``call`` over a dict of
three inputs), its own ``train_step`` (tape, ``compiled_loss``, ``optimizer.apply_gradients``, ``compiled_metrics``), the
``mixed_bfloat16`` precision policy (float32 variables, bfloat16 compute: the one that runs on CPU), a dataset the
user distributes himself (``strategy.experimental_distribute_dataset``) and hands to ``fit`` with ``steps_per_epoch``,
two embeddings (wide: a hashed cross feature; deep: items, attended over by ``MultiHeadAttention``).
Needs tf-keras and TF_USE_LEGACY_KERAS=1. ``python tf_widedeep_fit.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import keras_callback  # dagprof (1/2)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
ap.add_argument("--batch", type=int, default=64)
args = ap.parse_args()

tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
strategy = tf.distribute.MultiWorkerMirroredStrategy()
ITEMS, CROSS, HIST, DENSE = 5000, 3000, 12, 16


class WideDeep(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.wide = tf.keras.layers.Embedding(CROSS, 1, name="wide_cross")
        self.items = tf.keras.layers.Embedding(ITEMS, 32, name="item_embed")
        self.attend = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=16, name="history_attention")
        self.norm = tf.keras.layers.LayerNormalization(name="history_norm")
        self.deep1 = tf.keras.layers.Dense(128, activation="relu", name="deep1")
        self.deep2 = tf.keras.layers.Dense(64, activation="relu", name="deep2")
        self.head = tf.keras.layers.Dense(1, name="head", dtype="float32")  # logits in float32, as the guide says

    def call(self, inputs, training=False):
        hist = self.items(inputs["history"])                      # (batch, HIST, 32)
        target = self.items(inputs["target"])[:, None, :]          # (batch, 1, 32)
        seen = self.norm(self.attend(target, hist, training=training))[:, 0, :]
        deep = self.deep2(self.deep1(tf.concat([seen, tf.cast(inputs["dense"], seen.dtype)], axis=-1)))
        wide = tf.cast(self.wide(inputs["cross"]), deep.dtype)
        return self.head(deep) + tf.cast(wide, tf.float32)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            logits = self(x, training=True)
            loss = self.compiled_loss(y, logits, regularization_losses=self.losses)
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
        self.compiled_metrics.update_state(y, logits)
        return {m.name: m.result() for m in self.metrics}


GLOBAL = args.batch * strategy.num_replicas_in_sync
rng = np.random.default_rng(11)
n = 8 * GLOBAL
features = {"history": rng.integers(0, ITEMS, (n, HIST)).astype(np.int32), "target": rng.integers(0, ITEMS, n).astype(np.int32),
            "cross": rng.integers(0, CROSS, n).astype(np.int32), "dense": rng.standard_normal((n, DENSE)).astype(np.float32)}
labels = rng.integers(0, 2, (n, 1)).astype(np.float32)
ds = tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(n, seed=1).repeat().batch(GLOBAL, drop_remainder=True)

with strategy.scope():
    model = WideDeep()
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[tf.keras.metrics.AUC(from_logits=True, name="auc")])

model.fit(strategy.experimental_distribute_dataset(ds), epochs=1, steps_per_epoch=args.steps, verbose=0,
          callbacks=[keras_callback(args.out, steps=tuple(map(int, args.window.split(":"))))])  # dagprof (2/2)
