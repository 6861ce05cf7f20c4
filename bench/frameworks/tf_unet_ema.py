"""A user's TensorFlow script: a small U-Net segmenting synthetic 32x32 images into 3 classes (two strided
down-sampling stages, ``Conv2DTranspose`` up-sampling with skip connections concatenated, a 1x1 head), trained in a
custom loop under MultiWorkerMirroredStrategy with a Dice + cross-entropy loss.

Habits it exercises that the other TF scripts do not: the strategy built with
``CommunicationOptions(implementation=RING, bytes_per_pack=...)`` (the gradients packed into several all-reduces),
an optimizer keeping an exponential moving average of the weights (``AdamW(use_ema=True)``), a ``CosineDecay``
schedule with a linear warm-up (``warmup_target``), a ``MeanIoU`` metric updated from the argmax of the logits,
``tf.function(reduce_retracing=True)``, and the images and masks built by a ``tf.data`` pipeline that generates
them on the fly (``Dataset.range(...).map``), distributed with ``experimental_distribute_dataset``.
``python tf_unet_ema.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse

import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=16)
args = ap.parse_args()

options = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING, bytes_per_pack=64 * 1024)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
GLOBAL = args.batch * strategy.num_replicas_in_sync
CLASSES = 3


def conv_block(x, ch, name):
    x = tf.keras.layers.Conv2D(ch, 3, padding="same", activation="relu", name=f"{name}_a")(x)
    return tf.keras.layers.Conv2D(ch, 3, padding="same", activation="relu", name=f"{name}_b")(x)


with strategy.scope():
    image = tf.keras.Input((32, 32, 1), name="image")
    e1 = conv_block(image, 16, "enc1")
    e2 = conv_block(tf.keras.layers.Conv2D(32, 3, strides=2, padding="same", name="down1")(e1), 32, "enc2")
    mid = conv_block(tf.keras.layers.Conv2D(64, 3, strides=2, padding="same", name="down2")(e2), 64, "mid")
    d2 = tf.keras.layers.Conv2DTranspose(32, 2, strides=2, name="up2")(mid)
    d2 = conv_block(tf.keras.layers.Concatenate(name="skip2")([d2, e2]), 32, "dec2")
    d1 = tf.keras.layers.Conv2DTranspose(16, 2, strides=2, name="up1")(d2)
    d1 = conv_block(tf.keras.layers.Concatenate(name="skip1")([d1, e1]), 16, "dec1")
    logits = tf.keras.layers.Conv2D(CLASSES, 1, name="head")(d1)
    model = tf.keras.Model(image, logits, name="unet")
    schedule = tf.keras.optimizers.schedules.CosineDecay(1e-4, decay_steps=args.steps, warmup_target=3e-3, warmup_steps=4)
    opt = tf.keras.optimizers.AdamW(schedule, weight_decay=1e-4, use_ema=True, ema_momentum=0.98)
    miou = tf.keras.metrics.MeanIoU(num_classes=CLASSES)


def make_example(i):
    """An image of blobs and its mask: class 1 where a smooth field is high, class 2 where it is low."""
    g = tf.random.stateless_normal((8, 8, 1), seed=tf.stack([i, tf.constant(5, tf.int64)]))
    field = tf.image.resize(g, (32, 32), method="bicubic")
    mask = tf.cast(field > 0.5, tf.int32) + 2 * tf.cast(field < -0.5, tf.int32)
    return field + 0.2 * tf.random.stateless_normal((32, 32, 1), seed=tf.stack([i, tf.constant(9, tf.int64)])), mask[..., 0]


ds = tf.data.Dataset.range(1 << 20).map(make_example, num_parallel_calls=2).batch(GLOBAL, drop_remainder=True).prefetch(2)
it = iter(strategy.experimental_distribute_dataset(ds))


def dice_ce_loss(masks, logits):
    onehot = tf.one_hot(masks, CLASSES)
    probs = tf.nn.softmax(logits)
    inter = tf.reduce_sum(onehot * probs, axis=(1, 2))
    dice = 1.0 - (2.0 * inter + 1.0) / (tf.reduce_sum(onehot + probs, axis=(1, 2)) + 1.0)
    ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(masks, logits), axis=(1, 2))
    return tf.nn.compute_average_loss(ce + tf.reduce_mean(dice, axis=-1), global_batch_size=GLOBAL)


@tf.function(reduce_retracing=True)
def train_step(inputs):
    def replica_step(images, masks):
        with tf.GradientTape() as tape:
            out = model(images, training=True)
            loss = dice_ce_loss(masks, out)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        miou.update_state(masks, tf.argmax(out, -1))
        return loss
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=inputs), axis=None)


with tf_profile(args.out, steps=(6, 14), model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            loss = train_step(next(it))
        if step % 6 == 5:
            print(f"step {step}: loss {float(loss):.4f} mIoU {float(miou.result()):.3f}", flush=True)
            miou.reset_state()
