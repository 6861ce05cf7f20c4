"""A user's TensorFlow script: a small CNN on 32x32 images, custom loop under MultiWorkerMirroredStrategy.

Habits it exercises that tf_text.py does not: a distributed dataset (``experimental_distribute_dataset``) iterated
inside the loop, ``strategy.run`` returning per-replica losses that ``strategy.reduce`` sums, a loss scaled by the global
batch (``compute_average_loss``), a piecewise learning-rate schedule, global-norm gradient clipping before
``apply_gradients``, BatchNormalization (non-trainable moving statistics), an accuracy metric updated inside the step
and read with ``.numpy()`` every 5 steps, and a tag embedding (a second input) concatenated before the head.
``python tf_cnn_loop.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=32)
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
GLOBAL = args.batch * strategy.num_replicas_in_sync
TAGS = 2000
with strategy.scope():
    image = tf.keras.Input((32, 32, 3), name="image")
    tag = tf.keras.Input((), dtype="int32", name="tag")
    h = tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1")(image)
    h = tf.keras.layers.BatchNormalization(name="bn1")(h)
    h = tf.keras.layers.MaxPooling2D(name="pool1")(h)
    h = tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2")(h)
    h = tf.keras.layers.GlobalAveragePooling2D(name="gap")(h)
    t = tf.keras.layers.Embedding(TAGS, 16, name="tag_embed")(tag)
    h = tf.keras.layers.Concatenate(name="concat")([h, t])
    out = tf.keras.layers.Dense(10, name="logits")(h)
    model = tf.keras.Model([image, tag], out)
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay([8, 14], [0.05, 0.02, 0.01])
    opt = tf.keras.optimizers.SGD(schedule, momentum=0.9)
    acc = tf.keras.metrics.SparseCategoricalAccuracy()

rng = np.random.default_rng(7)
ds = tf.data.Dataset.from_tensor_slices(({"image": rng.standard_normal((4 * GLOBAL, 32, 32, 3)).astype(np.float32),
                                          "tag": rng.integers(0, TAGS, 4 * GLOBAL).astype(np.int32)},
                                         rng.integers(0, 10, 4 * GLOBAL).astype(np.int32))).repeat().batch(GLOBAL)
it = iter(strategy.experimental_distribute_dataset(ds))


@tf.function
def train_step(inputs):
    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            per_example = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL)
        grads = tape.gradient(loss, model.trainable_variables)
        grads, _ = tf.clip_by_global_norm(grads, 1.0)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        acc.update_state(labels, logits)
        return loss
    per_replica = strategy.run(replica_step, args=inputs)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


with tf_profile(args.out, steps=(6, 14), model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            loss = train_step(next(it))
        if step % 5 == 4:
            print(f"step {step}: loss {loss.numpy():.3f} acc {acc.result().numpy():.3f}", flush=True)
