"""A user's TensorFlow script: a Siamese pair classifier (Keras functional API), custom loop with ``strategy.run``.

Habits it exercises that the other TF scripts do not: one functional tower called on both inputs (its weights shared,
their gradients summed by the tape), a per-worker input pipeline (``distribute_datasets_from_function``, each worker
sharding by its ``InputContext``), kernel regularizers whose losses are scaled by ``tf.nn.scale_regularization_loss``,
``LayerNormalization`` and ``Dropout`` in residual blocks, Keras 3's ``AdamW`` with a cosine schedule, an AUC metric,
float32 throughout (no mixed precision), and the loss read with ``.numpy()`` every 4 steps.
``python tf_siamese_loop.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--batch", type=int, default=128, help="per worker")
ap.add_argument("--width", type=int, default=384)
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
GLOBAL = args.batch * strategy.num_replicas_in_sync
FEATURES, W = 96, args.width
reg = tf.keras.regularizers.L2(1e-5)


def tower() -> tf.keras.Model:
    x = tf.keras.Input((FEATURES,), name="features")
    h = tf.keras.layers.Dense(W, activation="gelu", kernel_regularizer=reg, name="proj")(x)
    for i in range(2):
        r = tf.keras.layers.LayerNormalization(name=f"ln{i}")(h)
        r = tf.keras.layers.Dense(W, activation="gelu", kernel_regularizer=reg, name=f"ff{i}")(r)
        r = tf.keras.layers.Dropout(0.1, name=f"drop{i}")(r)
        h = tf.keras.layers.Add(name=f"res{i}")([h, r])
    return tf.keras.Model(x, tf.keras.layers.LayerNormalization(name="ln_out")(h), name="tower")


with strategy.scope():
    left, right = tf.keras.Input((FEATURES,), name="left"), tf.keras.Input((FEATURES,), name="right")
    enc = tower()
    a, b = enc(left), enc(right)
    pair = tf.keras.layers.Concatenate(name="pair")([tf.keras.layers.Subtract(name="diff")([a, b]),
                                                     tf.keras.layers.Multiply(name="prod")([a, b])])
    h = tf.keras.layers.Dense(W // 2, activation="relu", kernel_regularizer=reg, name="head")(pair)
    model = tf.keras.Model([left, right], tf.keras.layers.Dense(1, name="logit")(h))
    schedule = tf.keras.optimizers.schedules.CosineDecay(1e-3, decay_steps=max(args.steps, 1), alpha=0.1)
    opt = tf.keras.optimizers.AdamW(schedule, weight_decay=1e-4)
    auc = tf.keras.metrics.AUC(name="auc")


def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    rng = np.random.default_rng(11 + ctx.input_pipeline_id)
    n = 8 * args.batch
    x = rng.standard_normal((n, 2, FEATURES)).astype(np.float32)
    y = (np.einsum("nf,nf->n", x[:, 0], x[:, 1]) > 0).astype(np.float32)[:, None]
    ds = tf.data.Dataset.from_tensor_slices(((x[:, 0], x[:, 1]), y)).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return ds.repeat().batch(ctx.get_per_replica_batch_size(GLOBAL)).prefetch(2)


it = iter(strategy.distribute_datasets_from_function(dataset_fn))


@tf.function
def train_step(inputs):
    def replica_step(pairs, labels):
        with tf.GradientTape() as tape:
            logits = model(pairs, training=True)
            per_example = tf.keras.losses.binary_crossentropy(labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL)
            loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        auc.update_state(labels, tf.sigmoid(logits))
        return loss
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=inputs), axis=None)


with tf_profile(args.out, steps=(6, 14), model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            loss = train_step(next(it))
        if step % 4 == 3:
            print(f"step {step}: loss {loss.numpy():.4f} auc {auc.result().numpy():.3f}", flush=True)
