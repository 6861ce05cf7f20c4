"""A user's recommender in a custom loop: a ragged watch history looked up in two tables with the same ids.

Written as a recommender user would: each user's history is a ``tf.RaggedTensor`` of item ids (1 to ``--max-hist``
items, Zipf-skewed), looked up with ``tf.ragged.map_flat_values(tf.nn.embedding_lookup, ...)`` in a context table
(averaged) and, with the same ids, in a per-item bias table (summed); the candidate item goes through its own Keras ``Embedding``. The loop is
``strategy.run`` inside a ``tf.function(reduce_retracing=True)`` over a distributed dataset, with a ``GradientTape``.
Every step each worker looks up a different number of ids, so the tables' sparse gradients have no static row count.
The three lines dagprof needs are marked. Run one process per worker with TF_CONFIG set
(bench/bench_frameworks.py does): ``python tf_recsys_ragged.py --out RUN``.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--global-batch", type=int, default=128)
ap.add_argument("--max-hist", type=int, default=40)
ap.add_argument("--dim", type=int, default=32)
ap.add_argument("--window", default="8:16")
args = ap.parse_args()

N_ITEMS, N_USERS = 20000, 4096
strategy = tf.distribute.MultiWorkerMirroredStrategy()

rng = np.random.default_rng(7)
lengths = rng.integers(1, args.max_hist + 1, N_USERS)
history = np.minimum(rng.zipf(1.3, lengths.sum()), N_ITEMS) - 1
candidates = np.minimum(rng.zipf(1.3, N_USERS), N_ITEMS) - 1
clicked = (rng.random(N_USERS) < 0.3).astype("float32")
ds = tf.data.Dataset.from_tensor_slices({
    "history": tf.RaggedTensor.from_row_lengths(history.astype("int64"), lengths),
    "item": candidates.astype("int64"), "clicked": clicked})
ds = ds.shuffle(N_USERS, seed=1).repeat().batch(args.global_batch, drop_remainder=True).prefetch(2)
opts = tf.data.Options()
opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
batches = iter(strategy.experimental_distribute_dataset(ds.with_options(opts)))


class TwoTowerCTR(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.ctx_table = self.add_weight(name="ctx_table", shape=(N_ITEMS, args.dim), initializer="glorot_uniform")
        self.bias_table = self.add_weight(name="bias_table", shape=(N_ITEMS, 1), initializer="zeros")
        self.item_emb = tf.keras.layers.Embedding(N_ITEMS, args.dim, name="item_emb")
        self.user_mlp = tf.keras.layers.Dense(args.dim, activation="relu", name="user_mlp")
        self.head = tf.keras.layers.Dense(1, name="head")

    def call(self, history, item):
        user = tf.reduce_mean(tf.ragged.map_flat_values(tf.nn.embedding_lookup, self.ctx_table, history), axis=1)
        bias = tf.reduce_sum(tf.ragged.map_flat_values(tf.nn.embedding_lookup, self.bias_table, history), axis=1)
        user = self.user_mlp(user)
        cand = self.item_emb(item)
        score = tf.reduce_sum(user * cand, axis=-1, keepdims=True) + bias
        return tf.squeeze(self.head(tf.concat([score, user], axis=-1)), -1)


with strategy.scope():
    model = TwoTowerCTR()
    model(tf.ragged.constant([[1, 2]], dtype=tf.int64), tf.constant([3], dtype=tf.int64))
    opt = tf.keras.optimizers.Adagrad(0.05)
bce = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")


@tf.function(reduce_retracing=True)
def train_step(batch):
    def replica_step(batch):
        with tf.GradientTape() as tape:
            logits = model(batch["history"], batch["item"])
            loss = tf.nn.compute_average_loss(bce(batch["clicked"][:, None], logits[:, None]),
                                              global_batch_size=args.global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    per_replica = strategy.run(replica_step, args=(batch,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


with tf_profile.tf_profile(args.out, steps=args.window, model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        batch = next(batches)
        with prof.step(step):  # dagprof (3/3)
            loss = train_step(batch)
        ids = sum(int(h.flat_values.shape[0]) for h in strategy.experimental_local_results(batch["history"]))
        tf.print("step", step, "history ids", ids, "loss", loss)  # the ids this worker looked up in each table
