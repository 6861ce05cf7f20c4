"""A user's TensorFlow script: a Deep & Cross Network (DCN-v2) click model on dense features, custom loop.

Habits it exercises that the other TF scripts do not: a subclassed Keras layer with its own weights (the cross layer,
``x0 * (W x + b) + x``) stacked three deep beside a deep tower, both towers read from one ``BatchNormalization`` of the
inputs, ``experimental_distribute_dataset`` on one global pipeline (auto-sharded by data), Keras 3's ``Adam`` with
``global_clipnorm`` left off and the gradients clipped by hand (``tf.clip_by_global_norm`` on each replica's gradients),
and the loss read with ``.numpy()`` every 5 steps. Written as a held-out job for ``--workers 4 --cores 2``.
``python tf_dcn_loop.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--batch", type=int, default=256, help="per worker")
ap.add_argument("--features", type=int, default=128)
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
GLOBAL = args.batch * strategy.num_replicas_in_sync
F = args.features


class Cross(tf.keras.layers.Layer):
    """One DCN-v2 cross layer: x0 * (W x + b) + x."""

    def build(self, shape):
        d = int(shape[0][-1])
        self.w = self.add_weight(name="w", shape=(d, d), initializer="glorot_uniform")
        self.b = self.add_weight(name="b", shape=(d,), initializer="zeros")

    def call(self, inputs):
        x0, x = inputs
        return x0 * (tf.matmul(x, self.w) + self.b) + x


with strategy.scope():
    inp = tf.keras.Input((F,), name="dense_features")
    x0 = tf.keras.layers.BatchNormalization(name="bn_in")(inp)
    c = x0
    for i in range(3):
        c = Cross(name=f"cross{i}")([x0, c])
    d = x0
    for i, w in enumerate((512, 256, 128)):
        d = tf.keras.layers.Dense(w, activation="relu", name=f"deep{i}")(d)
    h = tf.keras.layers.Concatenate(name="stack")([c, d])
    model = tf.keras.Model(inp, tf.keras.layers.Dense(1, name="ctr_logit")(h))
    opt = tf.keras.optimizers.Adam(5e-4)

rng = np.random.default_rng(3)
n = 16 * GLOBAL
x = rng.standard_normal((n, F)).astype(np.float32)
y = ((x[:, :8].sum(1) * x[:, 8:16].sum(1)) > 0).astype(np.float32)[:, None]
dist = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(GLOBAL).prefetch(2)))


@tf.function
def train_step(batch):
    def replica_step(feats, labels):
        with tf.GradientTape() as tape:
            logits = model(feats, training=True)
            per_example = tf.keras.losses.binary_crossentropy(labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL)
        grads, _ = tf.clip_by_global_norm(tape.gradient(loss, model.trainable_variables), 5.0)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=batch), axis=None)


with tf_profile(args.out, steps=(6, 14), model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            loss = train_step(next(dist))
        if step % 5 == 4:
            print(f"step {step}: loss {loss.numpy():.4f}", flush=True)
