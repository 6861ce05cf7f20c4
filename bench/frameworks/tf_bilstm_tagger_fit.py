"""A user's TensorFlow script: a part-of-speech-style sequence tagger (hashed word tokens, a ``Bidirectional`` LSTM over
a masked embedding, a per-token softmax through ``TimeDistributed``), Keras ``fit`` under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: variable-length sentences padded per batch (``padded_batch``) with
``mask_zero=True`` so the LSTMs skip the padding, string tokens hashed in the input pipeline by a Keras ``Hashing``
layer inside ``Dataset.map``, per-token sample weights (the dataset yields ``(x, y, w)``), a ``Bidirectional`` LSTM (two
while-loops, one reversed), RMSprop with a per-variable ``clipnorm``, and the Keras callbacks users reach for:
``ModelCheckpoint`` (weights only, every epoch, to a per-worker temporary folder), ``ReduceLROnPlateau`` and
``EarlyStopping`` on the validation loss, beside dagprof's.
Needs tf-keras and TF_USE_LEGACY_KERAS=1. ``python tf_bilstm_tagger_fit.py --out RUN`` per worker, TF_CONFIG set.
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
ap.add_argument("--steps-per-epoch", type=int, default=8)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
ap.add_argument("--maxlen", type=int, default=30, help="the longest sentence, and the padded length (a shorter LSTM loop)")
args = ap.parse_args()

BUCKETS, TAGS, MAXLEN, WORDS = 3000, 12, args.maxlen, 400
strategy = tf.distribute.MultiWorkerMirroredStrategy()
worker = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)

with strategy.scope():
    tokens = tf.keras.Input((None,), dtype="int64", name="tokens")
    h = tf.keras.layers.Embedding(BUCKETS + 1, 64, mask_zero=True, name="embed")(tokens)
    h = tf.keras.layers.Bidirectional(tf.keras.layers.LSTM(48, return_sequences=True), name="bilstm")(h)
    h = tf.keras.layers.TimeDistributed(tf.keras.layers.Dense(64, activation="relu"), name="proj")(h)
    out = tf.keras.layers.TimeDistributed(tf.keras.layers.Dense(TAGS), name="tags")(h)
    model = tf.keras.Model(tokens, out, name="tagger")
    model.compile(optimizer=tf.keras.optimizers.RMSprop(1e-3, clipnorm=1.0),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["sparse_categorical_accuracy"])

rng = np.random.default_rng(11)
vocab = np.array([f"w{i}" for i in range(WORDS)])
hashing = tf.keras.layers.Hashing(num_bins=BUCKETS)  # bucket 0 is left to the padding: ids are shifted by one


def sentences(n):
    for _ in range(n):
        length = int(rng.integers(min(8, MAXLEN), MAXLEN + 1))
        ids = rng.integers(0, WORDS, length)
        yield vocab[ids], (ids % TAGS).astype(np.int32)


def dataset(n):
    ds = tf.data.Dataset.from_generator(lambda: sentences(n), output_signature=(
        tf.TensorSpec((None,), tf.string), tf.TensorSpec((None,), tf.int32)))
    ds = ds.map(lambda w, t: (hashing(w) + 1, t, tf.ones_like(t, tf.float32)), num_parallel_calls=tf.data.AUTOTUNE)
    global_batch = args.batch * strategy.num_replicas_in_sync
    return ds.cache().repeat().padded_batch(global_batch, padded_shapes=([MAXLEN], [MAXLEN], [MAXLEN])).prefetch(2)


ckpt = os.path.join(tempfile.mkdtemp(prefix=f"tagger{worker}_"), "weights.{epoch:02d}.h5")
model.fit(dataset(512), validation_data=dataset(128), validation_steps=2, epochs=args.epochs,
          steps_per_epoch=args.steps_per_epoch, verbose=2 if worker == 0 else 0,
          callbacks=[tf.keras.callbacks.ModelCheckpoint(ckpt, save_weights_only=True),
                     tf.keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1),
                     tf.keras.callbacks.EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True),
                     keras_callback(args.out, steps=tuple(map(int, args.window.split(":"))))])  # dagprof
