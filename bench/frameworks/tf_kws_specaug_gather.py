"""A user's TensorFlow script: a keyword spotter on raw synthetic 1 s waveforms at 8 kHz (Keras' ``MelSpectrogram`` layer
in the model: an STFT in the graph, log-mel frames), SpecAugment-style masking, a depthwise-separable CNN (DS-CNN) and a
speaker-id embedding added to its pooled features, a custom loop under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: the front end (framing, FFT, mel matrix) inside the trained model;
SpecAugment written by hand in the replica step (one random time mask and one random frequency mask per example, from
``tf.random.uniform`` bounds and ``tf.sequence_mask``-style comparisons, drawn afresh every step); ``strategy.gather``
of every replica's predictions and labels each step (a dense all-gather beside the gradients' all-reduce) for a global
confusion count on worker 0; reductions of the user's own: the worst per-example loss gathered and maxed
(``ReduceOp`` has no MAX) and the step's hits summed by ``get_replica_context().all_reduce`` inside the replica step;
``Adam`` with ``weight_decay`` set (Keras 3's decoupled decay). ``python tf_kws_specaug_gather.py --out RUN`` per
worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--window", default="6:14", help="the profiled steps A:B")
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
RATE, SAMPLES, MELS, WORDS, SPEAKERS = 8000, 8000, 40, 12, 200
GLOBAL_BATCH = args.batch * strategy.num_replicas_in_sync


class KeywordSpotter(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.mel = tf.keras.layers.MelSpectrogram(fft_length=256, sequence_stride=128, sequence_length=256,
                                                  sampling_rate=RATE, num_mel_bins=MELS, power_to_db=True)
        self.stem = tf.keras.layers.Conv2D(64, (5, 3), strides=2, padding="same", activation="relu")
        self.blocks = []
        for _ in range(3):
            self.blocks += [tf.keras.layers.DepthwiseConv2D(3, padding="same"), tf.keras.layers.BatchNormalization(),
                            tf.keras.layers.ReLU(), tf.keras.layers.Conv2D(64, 1), tf.keras.layers.BatchNormalization(),
                            tf.keras.layers.ReLU()]
        self.pool = tf.keras.layers.GlobalAveragePooling2D()
        self.speaker = tf.keras.layers.Embedding(SPEAKERS, 64)
        self.head = tf.keras.layers.Dense(WORDS)

    def features(self, wave):
        return self.mel(wave)  # (batch, mels, frames)

    def call(self, spec, speaker, training=False):
        x = tf.transpose(spec, [0, 2, 1])[..., None]  # (batch, frames, mels, 1)
        x = self.stem(x)
        for layer in self.blocks:
            x = layer(x, training=training) if isinstance(layer, tf.keras.layers.BatchNormalization) else layer(x)
        return self.head(self.pool(x) + self.speaker(speaker))


def spec_augment(spec, max_t=10, max_f=8):
    """One time and one frequency mask per example, widths and places drawn each call (SpecAugment without warping)."""
    b, f, t = tf.shape(spec)[0], tf.shape(spec)[1], tf.shape(spec)[2]
    tw = tf.random.uniform([b, 1], 0, max_t, tf.int32)
    t0 = tf.random.uniform([b, 1], 0, t - max_t, tf.int32)
    fw = tf.random.uniform([b, 1], 0, max_f, tf.int32)
    f0 = tf.random.uniform([b, 1], 0, f - max_f, tf.int32)
    ti, fi = tf.range(t)[None, :], tf.range(f)[None, :]
    keep_t = tf.logical_or(ti < t0, ti >= t0 + tw)[:, None, :]
    keep_f = tf.logical_or(fi < f0, fi >= f0 + fw)[:, :, None]
    return tf.where(tf.logical_and(keep_t, keep_f), spec, tf.reduce_mean(spec))


with strategy.scope():
    model = KeywordSpotter()
    model(model.features(tf.zeros((1, SAMPLES))), tf.zeros((1,), tf.int32))
    opt = tf.keras.optimizers.Adam(1e-3, weight_decay=1e-4)


def make_dataset():
    rng = np.random.default_rng(5)
    n = GLOBAL_BATCH * 4
    words = rng.integers(0, WORDS, n)
    t = np.arange(SAMPLES) / RATE
    wave = (np.sin(2 * np.pi * (300 + 90 * words[:, None]) * t) + 0.5 * rng.standard_normal((n, SAMPLES))).astype(np.float32)
    speakers = rng.integers(0, SPEAKERS, n).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices(((wave, speakers), words.astype(np.int32)))
    return ds.repeat().batch(GLOBAL_BATCH, drop_remainder=True).prefetch(2)


iterator = iter(strategy.experimental_distribute_dataset(make_dataset()))


def replica_step(inputs, labels):
    wave, speaker = inputs
    with tf.GradientTape() as tape:
        spec = spec_augment(model.features(wave))
        logits = model(spec, speaker, training=True)
        per_example = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    preds = tf.argmax(logits, -1, output_type=tf.int32)
    # a metric summed across the replicas inside the replica function (its own all-reduce beside the gradients')
    hits = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.stack([tf.reduce_sum(tf.cast(preds == labels, tf.float32)), tf.cast(tf.size(labels), tf.float32)]))
    return loss, tf.reduce_max(per_example)[None], preds, labels, hits


@tf.function
def train_step(it):
    inputs, labels = next(it)
    loss, worst, preds, truth, hits = strategy.run(replica_step, args=(inputs, labels))
    return (strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None),
            tf.reduce_max(strategy.gather(worst, axis=0)),  # ReduceOp has SUM and MEAN only: a max gathered, then taken
            strategy.gather(preds, axis=0), strategy.gather(truth, axis=0), strategy.experimental_local_results(hits)[0])


confusion = np.zeros((WORDS, WORDS), np.int64)
with tf_profile(args.out, steps=args.window, model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            loss, worst, preds, truth, hits = train_step(iterator)
        np.add.at(confusion, (truth.numpy(), preds.numpy()), 1)
        if step % 8 == 7 and strategy.cluster_resolver.task_id == 0:
            acc = np.trace(confusion) / confusion.sum()
            print(f"step {step}: loss {float(loss):.3f} worst {float(worst):.2f} global acc {acc:.3f} "
                  f"(this step {float(hits[0]) / float(hits[1]):.3f})", flush=True)
