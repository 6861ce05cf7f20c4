"""A user's TensorFlow script: single-image super-resolution after the Keras ESPCN example (Shi et al. 2016, small:
convolutions on the low-resolution luminance, then a sub-pixel layer, ``tf.nn.depth_to_space``, that rearranges
``r * r`` channels into an image ``r`` times larger) on synthetic 48x48 textures, 3x upscaling; Keras ``fit`` under
MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: the low-resolution inputs made inside the ``tf.data`` map from
each high-resolution crop (``tf.image.random_crop``, ``random_flip_left_right``, ``rot90`` by a random count, a
``tf.image.resize`` with ``method="bicubic"`` down by 3, then RGB to luminance by ``tf.image.rgb_to_yuv``), a
subclassed ``Model`` whose ``train_step`` takes a Charbonnier loss (a smooth L1, averaged per example and over the
global batch by ``tf.nn.compute_average_loss``) and tracks PSNR by ``tf.image.psnr`` in a ``keras.metrics.Mean`` it
resets through the ``metrics`` property, a residual bicubic skip (the network learns the difference from the
upscaled input), ``Orthogonal`` kernel initialisers, ``Adam`` with a ``PiecewiseConstantDecay`` schedule and
``global_clipnorm``, and ``AutoShardPolicy.DATA``. One line for dagprof: the callback. ``python tf_espcn_sr_fit.py
--out RUN`` per worker, TF_CONFIG set; needs tf-keras and ``TF_USE_LEGACY_KERAS=1``.
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
ap.add_argument("--batch", type=int, default=16, help="per worker")
ap.add_argument("--window", default="14:22")
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
HR, SCALE = 48, 3
GLOBAL = args.batch * strategy.num_replicas_in_sync


def textures(n, seed):
    """RGB images (n, 96, 96, 3) of a few oriented sinusoid gratings and blobs: structure at several frequencies."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:96, 0:96].astype(np.float32) / 96
    out = np.zeros((n, 96, 96, 3), np.float32)
    for _ in range(3):
        freq = rng.uniform(2, 14, (n, 1, 1, 1))
        angle = rng.uniform(0, np.pi, (n, 1, 1, 1))
        phase = rng.uniform(0, 2 * np.pi, (n, 1, 1, 1))
        wave = np.sin(2 * np.pi * freq * (np.cos(angle) * xx[None, ..., None] + np.sin(angle) * yy[None, ..., None]) + phase)
        out += rng.uniform(0.1, 0.3, (n, 1, 1, 3)).astype(np.float32) * wave
    return np.clip(0.5 + out, 0, 1)


def pair(img):
    hr = tf.image.random_crop(img, (HR, HR, 3))
    hr = tf.image.rot90(tf.image.random_flip_left_right(hr), k=tf.random.uniform((), 0, 4, tf.int32))
    lr = tf.image.resize(hr, (HR // SCALE, HR // SCALE), method="bicubic")
    return tf.image.rgb_to_yuv(lr)[..., :1], tf.image.rgb_to_yuv(hr)[..., :1]


def dataset(seed):
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    ds = tf.data.Dataset.from_tensor_slices(textures(256, seed)).shuffle(256, seed=seed).repeat()
    return ds.map(pair, num_parallel_calls=tf.data.AUTOTUNE).batch(GLOBAL, drop_remainder=True).prefetch(2).with_options(opts)


class ESPCN(tf.keras.Model):
    def __init__(self):
        super().__init__()
        init = tf.keras.initializers.Orthogonal()
        self.body = [tf.keras.layers.Conv2D(64, 5, padding="same", activation="tanh", kernel_initializer=init),
                     tf.keras.layers.Conv2D(64, 3, padding="same", activation="tanh", kernel_initializer=init),
                     tf.keras.layers.Conv2D(32, 3, padding="same", activation="tanh", kernel_initializer=init),
                     tf.keras.layers.Conv2D(SCALE * SCALE, 3, padding="same", kernel_initializer=init)]
        self.psnr = tf.keras.metrics.Mean(name="psnr")
        self.charbonnier = tf.keras.metrics.Mean(name="loss")

    def call(self, lr):
        x = lr
        for layer in self.body:
            x = layer(x)
        upscaled = tf.image.resize(lr, (HR, HR), method="bicubic")
        return upscaled + tf.nn.depth_to_space(x, SCALE)  # the residual over bicubic

    @property
    def metrics(self):
        return [self.charbonnier, self.psnr]

    def train_step(self, data):
        lr, hr = data
        with tf.GradientTape() as tape:
            sr = self(lr, training=True)
            per_example = tf.reduce_mean(tf.sqrt(tf.square(sr - hr) + 1e-6), axis=[1, 2, 3])
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        self.charbonnier.update_state(per_example)
        self.psnr.update_state(tf.image.psnr(tf.clip_by_value(sr, 0, 1), hr, max_val=1.0))
        return {m.name: m.result() for m in self.metrics}


with strategy.scope():
    model = ESPCN()
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay([16], [1e-3, 3e-4])
    model.compile(optimizer=tf.keras.optimizers.Adam(schedule, global_clipnorm=1.0))
history = model.fit(dataset(3), epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0,
                    callbacks=[keras_callback(args.out, steps=tuple(map(int, args.window.split(":"))))])  # dagprof
print(", ".join(f"{k} {v[-1]:.3f}" for k, v in history.history.items()), flush=True)
