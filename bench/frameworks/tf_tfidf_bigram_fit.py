"""A user's TensorFlow script: a TF-IDF bag-of-bigrams review classifier (the Keras text-classification recipe:
``TextVectorization(ngrams=2, output_mode="tf_idf")`` over the raw strings, a 2-layer MLP with Dropout on the
20,000-wide vectors, a sigmoid), on synthetic reviews whose sentiment words set the label; Keras ``fit`` under
MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: the corpus read from text shards on disk (each worker writes
its own shards of ``label<TAB>review`` lines first, as files a job would be given), the files listed with
``Dataset.list_files`` and read by ``interleave`` of ``TextLineDataset`` with parallel calls, the lines parsed with
``tf.strings.split``, the vectorizer ``adapt``-ed on a sample before the model is built and applied in the input
pipeline (``map`` before ``cache``, as Keras' docs advise for preprocessing that is not trainable), then
``cache``/``shuffle``/``batch``/``prefetch(AUTOTUNE)``, ``AutoShardPolicy.OFF`` (each worker reads its own shards);
``BinaryAccuracy`` and ``AUC`` metrics. One line for dagprof: the callback. ``python tf_tfidf_bigram_fit.py --out RUN``
per worker, TF_CONFIG set; needs tf-keras and ``TF_USE_LEGACY_KERAS=1``.
"""
import argparse
import json
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from dagprof.collect.hooks.tf_profile import keras_callback  # noqa: E402  (dagprof)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--steps-per-epoch", type=int, default=12)
ap.add_argument("--batch", type=int, default=32, help="per worker")
ap.add_argument("--window", default="14:22")
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

GOOD = ["great", "loved", "excellent", "wonderful", "superb", "best", "enjoyed", "perfect"]
BAD = ["awful", "boring", "worst", "terrible", "waste", "dull", "poor", "hated"]
FILLER = [f"w{i}" for i in range(3000)]


def write_shards(folder, n_files=4, lines=600, seed=0):
    """Reviews of 20-80 words: filler drawn Zipf-like, a few sentiment words, the label the majority's side."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(FILLER) + 1)
    p /= p.sum()
    for f in range(n_files):
        with open(os.path.join(folder, f"reviews-{f}.txt"), "w") as out:
            for _ in range(lines):
                words = list(rng.choice(FILLER, rng.integers(20, 80), p=p))
                good, bad = rng.integers(0, 4, 2)
                words += list(rng.choice(GOOD, good)) + list(rng.choice(BAD, bad)) + ["not"] * int(rng.integers(0, 2))
                rng.shuffle(words)
                out.write(f"{int(good > bad)}\t{' '.join(words)}\n")


data_dir = tempfile.mkdtemp(prefix=f"reviews-w{worker}-")
write_shards(data_dir, seed=worker)


def parse(line):
    parts = tf.strings.split(line, "\t", maxsplit=1)
    return parts[1], tf.strings.to_number(parts[0], tf.float32)


lines = (tf.data.Dataset.list_files(os.path.join(data_dir, "reviews-*.txt"), shuffle=True, seed=worker)
         .interleave(tf.data.TextLineDataset, cycle_length=2, num_parallel_calls=tf.data.AUTOTUNE)
         .map(parse, num_parallel_calls=tf.data.AUTOTUNE))
vectorize = tf.keras.layers.TextVectorization(max_tokens=20000, ngrams=2, output_mode="tf_idf")
vectorize.adapt(lines.map(lambda text, label: text).take(1500).batch(256))

global_batch = args.batch * strategy.num_replicas_in_sync
ds = (lines.batch(256).map(lambda text, label: (vectorize(text), label), num_parallel_calls=tf.data.AUTOTUNE).unbatch()
      .cache().shuffle(2000, seed=worker).repeat().batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
opts = tf.data.Options()
opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
ds = ds.with_options(opts)

with strategy.scope():
    inputs = tf.keras.Input((vectorize.vocabulary_size(),), name="tfidf")
    x = tf.keras.layers.Dense(64, activation="relu", name="hidden")(inputs)
    x = tf.keras.layers.Dropout(0.5)(x)
    x = tf.keras.layers.Dense(32, activation="relu", name="hidden2")(x)
    outputs = tf.keras.layers.Dense(1, activation="sigmoid", name="sentiment")(x)
    model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), loss="binary_crossentropy",
                  metrics=[tf.keras.metrics.BinaryAccuracy(name="acc"), tf.keras.metrics.AUC(name="auc")])
history = model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0,
                    callbacks=[keras_callback(args.out, steps=tuple(map(int, args.window.split(":"))))])  # dagprof
print(f"worker {worker}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in history.history.items()), flush=True)
