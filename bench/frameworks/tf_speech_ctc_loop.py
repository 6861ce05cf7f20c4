"""A user's TensorFlow script: a small DeepSpeech2-style recogniser (Amodei et al. 2016, small: two strided 2-D
convolutions over a log spectrogram, each with BatchNormalization, a Dense projection, a bidirectional GRU and a
per-frame Dense over the symbols and CTC's blank) learning to spell synthetic "utterances" (3-6 symbols, each a tone of
its own pitch with noise), CTC loss, a custom loop under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: features computed inside the ``tf.data`` pipeline
(``tf.signal.stft`` -> log magnitude -> per-utterance normalisation in a ``map`` on raw waveforms), a dataset of
``(features, labels, label_length)`` dicts given to ``strategy.experimental_distribute_dataset`` from
``from_tensor_slices`` (auto-sharded by data), ``tf.nn.ctc_loss`` on dense padded labels with ``label_length`` and
``logit_length`` and ``blank_index=-1``, each replica clipping its own gradients by ``tf.clip_by_global_norm`` before
``apply_gradients`` all-reduces them (the common habit, not a clip of the global gradient), ``AdamW`` with an
``ExponentialDecay`` schedule, a ``tf.keras.metrics.Mean`` updated in the replica and reset every 4 steps, and a
greedy CTC decode (``tf.nn.ctc_greedy_decoder``) of one batch at the end, scored by ``tf.edit_distance``.
``python tf_speech_ctc_loop.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=32, help="per worker")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
GLOBAL = args.batch * strategy.num_replicas_in_sync
SYMBOLS, RATE, SAMPLES, MAX_LABEL = 12, 8000, 4000, 6  # half a second at 8 kHz
FRAMES, BINS = 1 + (SAMPLES - 256) // 128, 129


def utterances(n, seed):
    """Waveforms of 3-6 tones (symbol k at 300 + 180 k Hz) in noise, and their symbols padded to MAX_LABEL."""
    rng = np.random.default_rng(seed)
    wave = np.zeros((n, SAMPLES), np.float32)
    labels = np.zeros((n, MAX_LABEL), np.int32)
    lengths = rng.integers(3, MAX_LABEL + 1, n).astype(np.int32)
    t = np.arange(SAMPLES) / RATE
    for i in range(n):
        sym = rng.integers(0, SYMBOLS, lengths[i])
        labels[i, :lengths[i]] = sym
        edges = np.linspace(0, SAMPLES, lengths[i] + 1).astype(int)
        for k, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
            wave[i, a:b] = np.sin(2 * np.pi * (300 + 180 * sym[k]) * t[a:b])
    return wave + 0.3 * rng.standard_normal(wave.shape).astype(np.float32), labels, lengths


def featurize(wave, labels, length):
    spec = tf.math.log(tf.abs(tf.signal.stft(wave, frame_length=256, frame_step=128)) + 1e-6)
    spec = (spec - tf.reduce_mean(spec)) / (tf.math.reduce_std(spec) + 1e-6)
    return {"features": spec[..., tf.newaxis], "labels": labels, "label_length": length}


def dataset():
    ds = tf.data.Dataset.from_tensor_slices(utterances(GLOBAL * 16, seed=11)).map(featurize, num_parallel_calls=2)
    opts = tf.data.Options()
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.shuffle(512, seed=3).repeat().batch(GLOBAL, drop_remainder=True).prefetch(2).with_options(opts)


def build() -> tf.keras.Model:
    x = inp = tf.keras.Input((FRAMES, BINS, 1), name="spectrogram")
    for i in range(2):
        x = tf.keras.layers.Conv2D(32, (3, 5), strides=(1, 2), padding="same", use_bias=False, name=f"conv{i}")(x)
        x = tf.keras.layers.ReLU()(tf.keras.layers.BatchNormalization(name=f"bn{i}")(x))
    x = tf.keras.layers.Reshape((FRAMES, -1))(x)
    x = tf.keras.layers.Dense(128, activation="relu", name="project")(x)
    x = tf.keras.layers.Bidirectional(tf.keras.layers.GRU(96, return_sequences=True), name="bigru")(x)
    return tf.keras.Model(inp, tf.keras.layers.Dense(SYMBOLS + 1, name="symbols")(x), name="deepspeech")


with strategy.scope():
    model = build()
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(2e-3, decay_steps=8, decay_rate=0.9)
    opt = tf.keras.optimizers.AdamW(schedule, weight_decay=1e-4)
    train_loss = tf.keras.metrics.Mean("ctc")


def ctc(batch, logits):
    n = tf.shape(logits)[0]
    return tf.nn.ctc_loss(batch["labels"], logits, batch["label_length"], tf.fill([n], FRAMES),
                          logits_time_major=False, blank_index=-1)


@tf.function
def train_step(dist_batch):
    def replica_step(batch):
        with tf.GradientTape() as tape:
            per_example = ctc(batch, model(batch["features"], training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL)
        grads, _ = tf.clip_by_global_norm(tape.gradient(loss, model.trainable_variables), 5.0)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        train_loss.update_state(per_example)
        return loss
    return strategy.reduce("SUM", strategy.run(replica_step, args=(dist_batch,)), axis=None)


it = iter(strategy.experimental_distribute_dataset(dataset()))
with tf_profile(args.out, steps=tuple(map(int, args.window.split(":"))), model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        batch = next(it)
        with prof.step(step):  # dagprof (3/3)
            loss = train_step(batch)
        if step % 4 == 3:
            print(f"step {step}: ctc {train_loss.result().numpy():.3f}", flush=True)
            train_loss.reset_state()

wave, labels, lengths = utterances(16, seed=99)
feats = featurize(wave, labels, lengths)
decoded, _ = tf.nn.ctc_greedy_decoder(tf.transpose(model(feats["features"], training=False), [1, 0, 2]),
                                      tf.fill([16], FRAMES), blank_index=-1)
truth = tf.sparse.from_dense(tf.where(tf.sequence_mask(lengths, MAX_LABEL), labels + 1, 0))
hyp = tf.SparseTensor(decoded[0].indices, decoded[0].values + 1, decoded[0].dense_shape)
print(f"symbol error rate {tf.reduce_mean(tf.edit_distance(tf.cast(hyp, tf.int64), tf.cast(truth, tf.int64))).numpy():.3f}")
