"""A user's TensorFlow script: a convolutional variational autoencoder on synthetic 28x28 images, a Keras functional
model trained by ``fit`` under MultiWorkerMirroredStrategy.
Habits it exercises that the other TF scripts do not: ``compile(steps_per_execution=2)`` (each call of Keras'
train function runs 2 batches in a loop; callbacks see every second batch; ``--steps-per-execution 1`` for one), a custom layer that samples the latent code and
adds the KL term with ``self.add_loss`` (the loss is the compiled reconstruction loss plus a layer's loss), Conv2D /
Conv2DTranspose, an input pipeline from a Python generator (``tf.data.Dataset.from_generator``, ``map`` with
``num_parallel_calls``, ``prefetch(AUTOTUNE)``) with auto-sharding turned off (each worker draws its own samples),
TF's multi-worker fault tolerance (``tf.keras.callbacks.BackupAndRestore``, checkpointing every epoch), a
``CosineDecay`` learning rate and Nadam.
Needs tf-keras and TF_USE_LEGACY_KERAS=1. ``python tf_vae_fit.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse
import json
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from dagprof.collect.hooks.tf_profile import keras_callback  # noqa: E402  (dagprof)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--steps-per-epoch", type=int, default=10)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--steps-per-execution", type=int, default=2)
ap.add_argument("--window", default="6:14", help="the profiled steps (calls of the train function), A:B")
args = ap.parse_args()

LATENT = 16
strategy = tf.distribute.MultiWorkerMirroredStrategy()
worker = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)


class Sampling(tf.keras.layers.Layer):
    """z = mean + exp(logvar / 2) * eps, and the KL divergence to N(0, 1) as the layer's loss."""

    def call(self, inputs):
        mean, logvar = inputs
        kl = -0.5 * tf.reduce_mean(tf.reduce_sum(1 + logvar - tf.square(mean) - tf.exp(logvar), axis=1))
        self.add_loss(1e-3 * kl)
        return mean + tf.exp(0.5 * logvar) * tf.random.normal(tf.shape(mean))


def build():
    img = tf.keras.Input((28, 28, 1))
    h = tf.keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu", name="enc_conv1")(img)
    h = tf.keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu", name="enc_conv2")(h)
    h = tf.keras.layers.Dense(128, activation="relu", name="enc_dense")(tf.keras.layers.Flatten()(h))
    z = Sampling(name="sampling")([tf.keras.layers.Dense(LATENT, name="z_mean")(h), tf.keras.layers.Dense(LATENT, name="z_logvar")(h)])
    h = tf.keras.layers.Dense(7 * 7 * 64, activation="relu", name="dec_dense")(z)
    h = tf.keras.layers.Reshape((7, 7, 64))(h)
    h = tf.keras.layers.Conv2DTranspose(32, 3, strides=2, padding="same", activation="relu", name="dec_deconv1")(h)
    out = tf.keras.layers.Conv2DTranspose(1, 3, strides=2, padding="same", activation="sigmoid", name="dec_deconv2")(h)
    return tf.keras.Model(img, out, name="vae")


def blobs():
    """Endless images of a few Gaussian blobs, as a user's own loader might yield them."""
    rng = np.random.default_rng(10 + worker)
    yy, xx = np.mgrid[0:28, 0:28]
    while True:
        cy, cx = rng.uniform(4, 24, (2, 3))
        img = np.exp(-((yy[..., None] - cy) ** 2 + (xx[..., None] - cx) ** 2) / 8).sum(-1)
        yield np.clip(img, 0, 1).astype(np.float32)[..., None]


opts = tf.data.Options()
opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
ds = (tf.data.Dataset.from_generator(blobs, output_signature=tf.TensorSpec((28, 28, 1), tf.float32))
      .map(lambda x: (x, x), num_parallel_calls=tf.data.AUTOTUNE)
      .batch(args.batch * strategy.num_replicas_in_sync).prefetch(tf.data.AUTOTUNE).with_options(opts))

with strategy.scope():
    model = build()
    lr = tf.keras.optimizers.schedules.CosineDecay(2e-3, decay_steps=args.epochs * args.steps_per_epoch)
    model.compile(optimizer=tf.keras.optimizers.Nadam(lr), loss="binary_crossentropy", steps_per_execution=args.steps_per_execution)

backup = os.path.join(tempfile.gettempdir(), "vae-backup-" + os.path.abspath(args.out).strip("/").replace("/", "_"))  # one per job
model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2 if worker == 0 else 0,
          callbacks=[tf.keras.callbacks.BackupAndRestore(backup), keras_callback(args.out, steps=tuple(map(int, args.window.split(":"))))])  # dagprof
