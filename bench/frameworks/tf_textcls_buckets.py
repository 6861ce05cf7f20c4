"""A user's text classifier in a custom loop: reviews of many lengths, bucketed, with a warm-up + cosine schedule.

Written as an NLP user would: variable-length token sequences from a generator, ``bucket_by_sequence_length``
(so a step's padded length changes step to step and differs between the workers), one input pipeline per worker
from ``distribute_datasets_from_function``, an ``Embedding(mask_zero=True)`` + masked Conv1D + pooling model, AdamW
on a warm-up-then-cosine learning-rate schedule, ``tf.function(reduce_retracing=True)`` around ``strategy.run``.
The embedding's sparse gradient has as many rows as the step's padded tokens. The three lines dagprof needs are marked.
Run one process per worker with TF_CONFIG set (bench/bench_frameworks.py does): ``python tf_textcls_buckets.py --out RUN``.
"""
import argparse
import math

import numpy as np
import tensorflow as tf

from dagprof.collect import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=32, help="per worker")
ap.add_argument("--vocab", type=int, default=12000)
ap.add_argument("--window", default="8:16")
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
CLASSES = 5


def reviews(seed: int):
    rng = np.random.default_rng(seed)
    while True:
        n = int(np.clip(rng.lognormal(3.4, 0.6), 4, 200))
        yield rng.integers(1, args.vocab, n).astype("int32"), np.int32(rng.integers(0, CLASSES))


def make_ds(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_generator(lambda: reviews(100 + ctx.input_pipeline_id), output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)))
    bs = ctx.get_per_replica_batch_size(args.batch * ctx.num_input_pipelines)
    return ds.bucket_by_sequence_length(lambda x, y: tf.shape(x)[0], bucket_boundaries=[24, 48, 96],
                                        bucket_batch_sizes=[bs] * 4, drop_remainder=True).prefetch(2)


batches = iter(strategy.distribute_datasets_from_function(make_ds))


class WarmupCosine(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, peak, warmup, total):
        self.peak, self.warmup, self.total = peak, warmup, total

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warm = self.peak * step / self.warmup
        cos = 0.5 * self.peak * (1 + tf.cos(math.pi * tf.minimum(1.0, (step - self.warmup) / (self.total - self.warmup))))
        return tf.where(step < self.warmup, warm, cos)


with strategy.scope():
    tokens = tf.keras.Input((None,), dtype="int32", name="tokens")
    x = tf.keras.layers.Embedding(args.vocab, 96, mask_zero=True, name="tok_embed")(tokens)
    x = tf.keras.layers.Conv1D(128, 3, padding="same", activation="gelu", name="conv3")(x)
    x = tf.keras.layers.Conv1D(128, 5, padding="same", activation="gelu", name="conv5")(x)
    x = tf.keras.layers.GlobalAveragePooling1D(name="mean_pool")(x)
    x = tf.keras.layers.Dropout(0.2, name="drop")(x)
    logits = tf.keras.layers.Dense(CLASSES, name="classify")(x)
    model = tf.keras.Model(tokens, logits)
    opt = tf.keras.optimizers.AdamW(WarmupCosine(2e-3, 6, args.steps), weight_decay=1e-4)
xent = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
acc = tf.keras.metrics.SparseCategoricalAccuracy()


@tf.function(reduce_retracing=True)
def train_step(x, y):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            loss = tf.nn.compute_average_loss(xent(y, out), global_batch_size=args.batch * strategy.num_replicas_in_sync)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        acc.update_state(y, out)
        return loss
    return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)


with tf_profile.tf_profile(args.out, steps=args.window, model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        x, y = next(batches)
        with prof.step(step):  # dagprof (3/3)
            loss = train_step(x, y)
        shape = strategy.experimental_local_results(x)[0].shape
        tf.print("step", step, "batch", shape[0], "length", shape[1], "loss", loss, "acc", acc.result())
