"""A user's TensorFlow script: a temporal-fusion-style attention forecaster (a store-id embedding as the static
covariate, gated residual networks, an LSTM encoder started from the static context, causal multi-head self-attention
over its outputs, a quantile head) predicting the next ``HORIZON`` values of synthetic daily sales at 3 quantiles with
a pinball loss, Keras ``fit`` under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: ``compile(jit_compile=...)`` (``--jit``: XLA compiles Keras' train
step; TF 2.21 then compiles it again every step, seconds a step, and on two workers fails outright, the store
embedding's sparse gradient all-gathered by ``CollectiveGatherV2``, which has no XLA kernel), a pipeline of numpy
arrays (``from_tensor_slices``, ``shuffle``, ``repeat``, ``batch``, ``prefetch(AUTOTUNE)``) left to TF's default
auto-sharding, callbacks a forecaster keeps (a linear warm-up by ``LearningRateScheduler``, ``TerminateOnNaN``, a
``LambdaCallback`` logging every 5 batches), a subclassed gating layer (GLU + residual + ``LayerNormalization``), two
named inputs fed as a dict, a custom loss function, and Adam with ``clipnorm``. Needs tf-keras and
TF_USE_LEGACY_KERAS=1. ``python tf_tft_forecast_fit.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from dagprof.collect.hooks.tf_profile import keras_callback  # noqa: E402  (dagprof)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--steps-per-epoch", type=int, default=10)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--jit", action="store_true", help="compile(jit_compile=True)")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

STORES, LOOKBACK, HORIZON, FEATURES, DIM = 500, 28, 7, 4, 32
QUANTILES = (0.1, 0.5, 0.9)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
worker = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)


class GatedResidual(tf.keras.layers.Layer):
    """TFT's gated residual network: ELU dense, dense, a GLU gate, added to the (projected) input, layer-normed."""

    def __init__(self, units, project=False, **kw):
        super().__init__(**kw)
        self.fc1 = tf.keras.layers.Dense(units, activation="elu")
        self.fc2 = tf.keras.layers.Dense(units)
        self.gate = tf.keras.layers.Dense(2 * units)
        self.norm = tf.keras.layers.LayerNormalization()
        self.skip = tf.keras.layers.Dense(units) if project else tf.keras.layers.Identity()  # the input to ``units`` wide

    def call(self, x):
        h = self.gate(self.fc2(self.fc1(x)))
        value, gate = tf.split(h, 2, axis=-1)
        return self.norm(self.skip(x) + value * tf.sigmoid(gate))


def build():
    store = tf.keras.Input((), dtype=tf.int32, name="store")
    past = tf.keras.Input((LOOKBACK, FEATURES), name="past")
    static = GatedResidual(DIM, project=True, name="static_grn")(tf.keras.layers.Embedding(STORES, 16, name="store_embedding")(store))
    x = GatedResidual(DIM, project=True, name="input_grn")(past)
    enc = tf.keras.layers.LSTM(DIM, return_sequences=True, name="encoder")(x, initial_state=[static, static])
    att = tf.keras.layers.MultiHeadAttention(4, DIM // 4, name="attention")(enc, enc, use_causal_mask=True)
    h = GatedResidual(DIM, name="post_attention_grn")(tf.keras.layers.Add()([enc, att]))
    out = tf.keras.layers.Dense(HORIZON * len(QUANTILES), name="quantile_head")(h[:, -1])
    return tf.keras.Model({"store": store, "past": past}, tf.keras.layers.Reshape((HORIZON, len(QUANTILES)))(out), name="tft")


def pinball(y, q):
    """The quantile (pinball) loss, averaged over the horizon and the quantiles."""
    err = y[..., None] - q
    tau = tf.constant(QUANTILES)
    return tf.reduce_mean(tf.maximum(tau * err, (tau - 1.0) * err), axis=(-2, -1))


def series(n, seed):
    """Sales of ``n`` windows: a weekly season, a store level, noise; the last feature the day of week."""
    rng = np.random.default_rng(seed)
    stores = rng.integers(0, STORES, n).astype(np.int32)
    t = rng.integers(0, 365, n)[:, None] + np.arange(LOOKBACK + HORIZON)[None]
    level = 1.0 + (stores % 17)[:, None] / 17
    sales = level * (1 + 0.3 * np.sin(2 * np.pi * t / 7)) + 0.1 * rng.standard_normal(t.shape)
    feats = np.stack([sales[:, :LOOKBACK], np.sin(2 * np.pi * t[:, :LOOKBACK] / 7), np.cos(2 * np.pi * t[:, :LOOKBACK] / 7),
                      (t[:, :LOOKBACK] % 7) / 6.0], -1).astype(np.float32)
    return {"store": stores, "past": feats}, sales[:, LOOKBACK:].astype(np.float32)


inputs, targets = series(4096, 3)
ds = (tf.data.Dataset.from_tensor_slices((inputs, targets)).shuffle(4096, seed=worker).repeat()
      .batch(args.batch * strategy.num_replicas_in_sync, drop_remainder=True).prefetch(tf.data.AUTOTUNE))

with strategy.scope():
    model = build()
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3, clipnorm=1.0), loss=pinball, jit_compile=args.jit)

warmup = tf.keras.callbacks.LearningRateScheduler(lambda epoch, lr: 1e-3 * min(1.0, (epoch + 1) / 2))
log = tf.keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda b, logs: print(f"batch {b}: loss {logs['loss']:.4f}", flush=True) if worker == 0 and b % 5 == 4 else None)
model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0,
          callbacks=[warmup, tf.keras.callbacks.TerminateOnNaN(), log,
                     keras_callback(args.out, steps=tuple(map(int, args.window.split(":"))))])  # dagprof
