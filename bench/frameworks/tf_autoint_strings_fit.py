"""A user's TensorFlow script: an AutoInt click model (Song et al. 2019, small: one embedding per categorical field,
two layers of multi-head self-attention over the fields with residual projections, a logit over the flattened field
vectors) on synthetic ad impressions whose features arrive as strings; Keras ``fit`` under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: raw string features turned into ids inside the model by Keras
preprocessing layers, ``StringLookup`` ``adapt``-ed on the data inside the strategy's scope for the low-cardinality
fields (country, device, ad category; out-of-vocabulary ids kept) and ``Hashing(num_bins=..., salt=...)`` for the
high-cardinality ones (user and ad ids), a dict dataset of numpy string arrays with a per-example ``sample_weight``
(clicks weighted up, as for an imbalanced label) as its third element, ``MultiHeadAttention`` over the field axis,
``AUC`` and ``Precision`` metrics, and a ``LearningRateScheduler`` callback beside dagprof's. Needs tf-keras and
TF_USE_LEGACY_KERAS=1. ``python tf_autoint_strings_fit.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from dagprof.collect.hooks.tf_profile import keras_callback  # noqa: E402  (dagprof)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--epochs", type=int, default=1)
ap.add_argument("--steps-per-epoch", type=int, default=20)
ap.add_argument("--batch", type=int, default=64, help="per worker")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

DIM, HEADS = 16, 2
LOOKUP = ("country", "device", "category")
HASHED = {"user_id": 20_000, "ad_id": 5_000}
strategy = tf.distribute.MultiWorkerMirroredStrategy()


def impressions(n, seed=0):
    """String features as a log would hold them, a click that depends on a few of them, a weight per example."""
    rng = np.random.default_rng(seed)
    countries = np.array(["us", "de", "br", "in", "jp", "fr", "ng", "mx"])
    devices = np.array(["ios", "android", "desktop", "tablet"])
    country, device = countries[rng.integers(0, 8, n)], devices[rng.integers(0, 4, n)]
    category = np.array([f"cat{c}" for c in rng.zipf(1.6, n) % 40])
    user = np.array([f"u{u}" for u in rng.integers(0, 200_000, n)])
    ad = np.array([f"ad{a}" for a in rng.zipf(1.3, n) % 30_000])
    logit = -2 + 1.5 * (device == "ios") + 0.8 * np.isin(country, ["us", "jp"]) + 0.05 * (np.char.str_len(category) - 4)
    click = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    features = {"country": country, "device": device, "category": category, "user_id": user, "ad_id": ad}
    return features, click, np.where(click > 0, 3.0, 1.0).astype(np.float32)


features, clicks, weights = impressions(6000)
with strategy.scope():
    inputs = {name: tf.keras.Input((1,), dtype=tf.string, name=name) for name in (*LOOKUP, *HASHED)}
    fields = []
    for name in LOOKUP:
        lookup = tf.keras.layers.StringLookup(num_oov_indices=1, name=f"{name}_lookup")
        lookup.adapt(features[name])
        fields.append(tf.keras.layers.Embedding(lookup.vocabulary_size(), DIM, name=f"{name}_emb")(lookup(inputs[name])))
    for name, bins in HASHED.items():
        ids = tf.keras.layers.Hashing(num_bins=bins, salt=17, name=f"{name}_hash")(inputs[name])
        fields.append(tf.keras.layers.Embedding(bins, DIM, name=f"{name}_emb")(ids))
    x = tf.keras.layers.Concatenate(axis=1, name="fields")(fields)  # (batch, 5 fields, DIM)
    for i in range(2):
        att = tf.keras.layers.MultiHeadAttention(HEADS, DIM, name=f"interacting{i}")(x, x)
        x = tf.keras.layers.ReLU(name=f"relu{i}")(att + tf.keras.layers.Dense(DIM, use_bias=False, name=f"residual{i}")(x))
    logit = tf.keras.layers.Dense(1, activation="sigmoid", name="click")(tf.keras.layers.Flatten(name="flat")(x))
    model = tf.keras.Model(inputs, logit)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), loss="binary_crossentropy",
                  weighted_metrics=[], metrics=[tf.keras.metrics.AUC(name="auc"), tf.keras.metrics.Precision(name="precision")])

ds = (tf.data.Dataset.from_tensor_slices(({k: v[:, None] for k, v in features.items()}, clicks, weights))
      .shuffle(6000, seed=5).repeat().batch(args.batch * strategy.num_replicas_in_sync, drop_remainder=True).prefetch(2))
model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0,
          callbacks=[tf.keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9 if epoch else lr),
                     keras_callback(args.out, steps=tuple(map(int, args.window.split(":"))))])  # dagprof
