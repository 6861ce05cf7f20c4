"""A user's TensorFlow script: a one-block transformer language model in a custom loop under MultiWorkerMirroredStrategy.

Habits: token and position embeddings, ``MultiHeadAttention`` with a causal mask, pre-norm residuals, an input pipeline
built per worker by ``distribute_datasets_from_function`` (each worker shards by its ``InputContext``), ``strategy.run``
with ``tf.GradientTape``, gradients clipped by their global norm, AdamW, and the number of correct tokens summed over
the replicas with ``strategy.reduce(SUM)`` and logged every 6 steps. ``python tf_transformer_loop.py --out RUN`` per
worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
ap.add_argument("--batch", type=int, default=16)
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
VOCAB, SEQ, D = 4000, 32, 64
GLOBAL = args.batch * strategy.num_replicas_in_sync


class Block(tf.keras.layers.Layer):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.ln1 = tf.keras.layers.LayerNormalization()
        self.mha = tf.keras.layers.MultiHeadAttention(num_heads=4, key_dim=D // 4)
        self.ln2 = tf.keras.layers.LayerNormalization()
        self.ff1 = tf.keras.layers.Dense(4 * D, activation="gelu")
        self.ff2 = tf.keras.layers.Dense(D)

    def call(self, x):
        h = self.ln1(x)
        x = x + self.mha(h, h, use_causal_mask=True)
        return x + self.ff2(self.ff1(self.ln2(x)))


with strategy.scope():
    tokens = tf.keras.Input((SEQ,), dtype="int32")
    h = tf.keras.layers.Embedding(VOCAB, D, name="tok_embed")(tokens)
    pos = tf.keras.layers.Embedding(SEQ, D, name="pos_embed")(tf.range(SEQ)[None, :])
    h = Block(name="block")(h + pos)
    logits = tf.keras.layers.Dense(VOCAB, name="lm_head")(tf.keras.layers.LayerNormalization(name="final_norm")(h))
    model = tf.keras.Model(tokens, logits)
    opt = tf.keras.optimizers.AdamW(3e-4, weight_decay=0.01)


def make_dataset(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    rng = np.random.default_rng(100 + ctx.input_pipeline_id)
    text = rng.integers(0, VOCAB, (64, SEQ + 1)).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices(text).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return ds.map(lambda t: (t[:-1], t[1:])).repeat().batch(ctx.get_per_replica_batch_size(GLOBAL)).prefetch(2)


it = iter(strategy.distribute_datasets_from_function(make_dataset))


@tf.function
def train_step(batch):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            per_token = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(tf.reduce_mean(per_token, axis=1), global_batch_size=GLOBAL)
        grads = tape.gradient(loss, model.trainable_variables)
        grads, _ = tf.clip_by_global_norm(grads, 0.5)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_sum(tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == y, tf.float32))
    correct = strategy.run(replica_step, args=batch)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, correct, axis=None)


with tf_profile(args.out, steps=tuple(map(int, args.window.split(":"))), model=model) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            correct = train_step(next(it))
        if step % 6 == 5 and strategy.cluster_resolver.task_id == 0:
            print(f"step {step}: token accuracy {float(correct) / (GLOBAL * SEQ):.4f}", flush=True)
