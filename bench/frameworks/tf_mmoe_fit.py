"""A user's TensorFlow script: a multi-gate mixture-of-experts (MMoE, Ma et al. 2018) ranking model with two tasks,
a click (logistic) and a watch time (regression), on synthetic sessions; Keras ``fit`` under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: a functional model of two named inputs (a user's last 12 item
ids through an ``Embedding`` with ``mask_zero=True`` and a masked ``GlobalAveragePooling1D``; 6 numeric features through
a ``Normalization`` layer ``adapt``-ed on the data inside the strategy's scope: made outside it, ``compile`` refuses its
variables) and two named outputs, each with its own
loss, metric and ``loss_weights``; three expert MLPs mixed per task by a softmax gate (a ``Lambda``-free weighted sum in
``tf.einsum`` layers), a dict dataset ``({"items", "numeric"}, {"click", "watch"})`` with ``cache``, ``shuffle`` and
``prefetch(2)``, and ``ReduceLROnPlateau`` on the training loss beside dagprof's callback. Needs tf-keras and
TF_USE_LEGACY_KERAS=1. ``python tf_mmoe_fit.py --out RUN`` per worker, TF_CONFIG set.
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
ap.add_argument("--steps-per-epoch", type=int, default=12)
ap.add_argument("--batch", type=int, default=64, help="per worker")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

ITEMS, HISTORY, NUMERIC, DIM, EXPERTS = 4000, 12, 6, 32, 3
strategy = tf.distribute.MultiWorkerMirroredStrategy()


def sessions(n, seed=0):
    """Item histories (0 pads the short ones), numeric context, and two labels that share some of their causes."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, HISTORY + 1, n)
    items = np.where(np.arange(HISTORY) < lengths[:, None], rng.zipf(1.3, (n, HISTORY)) % (ITEMS - 1) + 1, 0)
    numeric = (rng.standard_normal((n, NUMERIC)) * [1, 5, 30, 0.2, 2, 100]).astype(np.float32)
    taste = (items % 7 == 0).sum(1) / lengths
    click = (rng.random(n) < 1 / (1 + np.exp(-(3 * taste + numeric[:, 0] - 1)))).astype(np.float32)
    watch = (np.log1p(lengths) + 0.01 * numeric[:, 2] + 2 * taste * click + 0.3 * rng.standard_normal(n)).astype(np.float32)
    return {"items": items.astype(np.int32), "numeric": numeric}, {"click": click, "watch": watch}


features, labels = sessions(4096)
with strategy.scope():
    norm = tf.keras.layers.Normalization(name="numeric_norm")
    norm.adapt(features["numeric"])
    items_in = tf.keras.Input((HISTORY,), dtype="int32", name="items")
    numeric_in = tf.keras.Input((NUMERIC,), name="numeric")
    emb = tf.keras.layers.Embedding(ITEMS, DIM, mask_zero=True, name="item_emb")(items_in)
    pooled = tf.keras.layers.GlobalAveragePooling1D(name="history_pool")(emb)
    x = tf.keras.layers.Concatenate(name="shared_in")([pooled, norm(numeric_in)])
    experts = [tf.keras.layers.Dense(32, activation="relu", name=f"expert{e}_out")(
               tf.keras.layers.Dense(64, activation="relu", name=f"expert{e}_hidden")(x)) for e in range(EXPERTS)]
    stacked = tf.keras.layers.Concatenate(axis=1, name="experts")([tf.keras.layers.Reshape((1, 32))(e) for e in experts])
    outputs = {}
    for task, act in (("click", "sigmoid"), ("watch", None)):
        gate = tf.keras.layers.Dense(EXPERTS, activation="softmax", name=f"{task}_gate")(x)
        mixed = tf.keras.layers.Dot(axes=(1, 1), name=f"{task}_mix")([gate, stacked])
        tower = tf.keras.layers.Dense(16, activation="relu", name=f"{task}_tower")(mixed)
        outputs[task] = tf.keras.layers.Dense(1, activation=act, name=task)(tower)
    model = tf.keras.Model({"items": items_in, "numeric": numeric_in}, outputs)
    model.compile(optimizer=tf.keras.optimizers.Adam(2e-3),
                  loss={"click": "binary_crossentropy", "watch": tf.keras.losses.Huber(delta=1.0)},
                  loss_weights={"click": 1.0, "watch": 0.5},
                  metrics={"click": [tf.keras.metrics.AUC(name="auc")], "watch": ["mae"]})

ds = (tf.data.Dataset.from_tensor_slices((features, labels)).cache().shuffle(4096, seed=3).repeat()
      .batch(args.batch * strategy.num_replicas_in_sync, drop_remainder=True).prefetch(2))
model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0,
          callbacks=[tf.keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1),
                     keras_callback(args.out, steps=tuple(map(int, args.window.split(":"))))])  # dagprof
