"""A user's TensorFlow script: a small MobileNet-style image classifier (a strided stem, depthwise-separable blocks:
``DepthwiseConv2D`` + pointwise ``Conv2D`` with ReLU6, global average pooling, a Dense head) on synthetic 32x32 images,
a custom loop under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: gradient accumulation written by hand (per-replica accumulator
variables, ``synchronization=ON_READ``, ``aggregation=SUM``, filled by one ``strategy.run`` per micro-batch, then a
third ``tf.function`` that applies them: 3 calls a step, the gradients all-reduced in the last one only), the strategy
built with ``CommunicationOptions(bytes_per_pack=...)`` (TF's own knob for its all-reduces, which packs the gradients
into several all-reduces) and the RING implementation, each gradient clipped by its own norm (``tf.clip_by_norm``), an
input pipeline with ``cache``, ``shuffle``, ``repeat`` and ``prefetch`` built per worker by
``distribute_datasets_from_function``, SGD with Nesterov momentum. ``python tf_mobilenet_accum.py --out RUN`` per
worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--window", default="6:14")
ap.add_argument("--micro", type=int, default=2)
ap.add_argument("--pack-kb", type=int, default=64, help="bytes_per_pack of the strategy's all-reduces, kB (0: TF's default)")
args = ap.parse_args()

options = tf.distribute.experimental.CommunicationOptions(
    bytes_per_pack=args.pack_kb * 1024, implementation=tf.distribute.experimental.CommunicationImplementation.RING)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
MB = 16  # a replica's micro-batch


def block(x, filters, stride, name):
    x = tf.keras.layers.DepthwiseConv2D(3, strides=stride, padding="same", name=f"{name}_dw")(x)
    x = tf.keras.layers.ReLU(6.0, name=f"{name}_dw_relu")(x)
    x = tf.keras.layers.Conv2D(filters, 1, name=f"{name}_pw")(x)
    return tf.keras.layers.ReLU(6.0, name=f"{name}_pw_relu")(x)


with strategy.scope():
    inp = tf.keras.Input((32, 32, 3))
    x = tf.keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu", name="stem")(inp)
    for i, (f, s) in enumerate([(64, 1), (128, 2), (128, 1), (256, 2)]):
        x = block(x, f, s, f"block{i}")
    x = tf.keras.layers.GlobalAveragePooling2D(name="pool")(x)
    model = tf.keras.Model(inp, tf.keras.layers.Dense(10, name="head")(x))
    opt = tf.keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True)
    accum = [tf.Variable(tf.zeros_like(v), trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                         aggregation=tf.VariableAggregation.SUM) for v in model.trainable_variables]


def dataset_fn(ctx):
    rng = np.random.default_rng(ctx.input_pipeline_id)
    images = rng.standard_normal((8 * MB, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 8 * MB).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((images, labels)).cache().shuffle(8 * MB).repeat().batch(MB).prefetch(2)


it = iter(strategy.distribute_datasets_from_function(dataset_fn))


@tf.function
def accumulate(batch):
    def replica(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        for a, g in zip(accum, tape.gradient(loss, model.trainable_variables)):
            a.assign_add(g)
        return loss
    return strategy.run(replica, args=batch)


@tf.function
def apply():
    def replica():
        grads = [tf.clip_by_norm(a.read_value() / args.micro, 1.0) for a in accum]
        opt.apply_gradients(zip(grads, model.trainable_variables))
        for a in accum:
            a.assign(tf.zeros_like(a))
    strategy.run(replica)


a, b = map(int, args.window.split(":"))
with tf_profile(args.out, steps=(a, b), model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            for _ in range(args.micro):
                loss = accumulate(next(it))
            apply()
        if step % 5 == 0:  # every worker joins the reduce; the chief prints
            mean = float(strategy.reduce("MEAN", loss, axis=None))
            if strategy.cluster_resolver.task_id == 0:
                print(f"step {step}: loss {mean:.3f}", flush=True)
