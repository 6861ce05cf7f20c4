"""A user's TensorFlow script: an LSTM next-token model in a custom loop under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: a recurrent layer in a hand-written ``tf.function`` step (the
LSTM is a while loop in the graph, as Keras ``fit``'s GRU in tf_gru_fit.py, but traced by the user's own function),
a second loop of the user's own (``tf.while_loop`` over the sequence for a per-position weighting of the loss), a
``strategy.run`` whose loss is averaged with ``compute_average_loss`` and gradients summed by the strategy, RMSprop,
and an input pipeline with ``map`` and ``prefetch``.
``python tf_lstm_loop.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seq", type=int, default=24, help="tokens per sequence (LSTM steps)")
args = ap.parse_args()

VOCAB, LEN = 3000, args.seq
strategy = tf.distribute.MultiWorkerMirroredStrategy()
GLOBAL = args.batch * strategy.num_replicas_in_sync
with strategy.scope():
    tokens = tf.keras.Input((LEN,), dtype="int32", name="tokens")
    h = tf.keras.layers.Embedding(VOCAB, 32, name="embed")(tokens)
    h = tf.keras.layers.LSTM(48, return_sequences=True, name="lstm")(h)
    out = tf.keras.layers.Dense(VOCAB, name="next_token")(h)
    model = tf.keras.Model(tokens, out)
    opt = tf.keras.optimizers.RMSprop(1e-3)

rng = np.random.default_rng(11)
text = rng.integers(0, VOCAB, (8 * GLOBAL, LEN + 1)).astype(np.int32)
ds = (tf.data.Dataset.from_tensor_slices(text).repeat().batch(GLOBAL)
      .map(lambda s: (s[:, :-1], s[:, 1:])).prefetch(2))
it = iter(strategy.experimental_distribute_dataset(ds))


def position_weights(n: int) -> tf.Tensor:
    """Later positions weigh more (they see more context): a tf.while_loop of the user's own."""
    def body(i, acc):
        return i + 1, acc.write(i, 0.5 + tf.cast(i, tf.float32) / tf.cast(n, tf.float32))
    _, acc = tf.while_loop(lambda i, _: i < n, body, (tf.constant(0), tf.TensorArray(tf.float32, size=n)))
    return acc.stack()


@tf.function
def train_step(inputs):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            per_token = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            per_example = tf.reduce_mean(per_token * position_weights(LEN), axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    per_replica = strategy.run(replica_step, args=inputs)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


with tf_profile(args.out, steps=(6, 14), model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            loss = train_step(next(it))
        if step % 8 == 7:
            print(f"step {step}: loss {loss.numpy():.3f}", flush=True)
