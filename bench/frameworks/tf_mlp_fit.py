"""A user's TensorFlow script: a 5-layer MLP trained with Keras ``fit`` under MultiWorkerMirroredStrategy.

Needs tf-keras and TF_USE_LEGACY_KERAS=1 (Keras 3 ``fit`` fails under this strategy). One line for
dagprof: the callback. ``python tf_mlp_fit.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from dagprof.collect.hooks.tf_profile import keras_callback  # noqa: E402  (dagprof)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=36)
ap.add_argument("--batch", type=int, default=64)
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((256,))] + [tf.keras.layers.Dense(256, activation="relu", name=f"dense{i}") for i in range(4)]
                                + [tf.keras.layers.Dense(10, name="logits")])
    model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(0)
n = args.batch * strategy.num_replicas_in_sync
ds = tf.data.Dataset.from_tensor_slices((rng.standard_normal((n, 256), dtype=np.float32), rng.integers(0, 10, n))).batch(n).repeat()
opts = tf.data.Options()
opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
model.fit(ds.with_options(opts), epochs=1, steps_per_epoch=args.steps, verbose=0,
          callbacks=[keras_callback(args.out, steps=(6, 14))])  # dagprof
