"""A user's word2vec: skip-gram with negative sampling over sentences of many lengths, in a custom loop.

Written as an embeddings user would: a generator of Zipf-distributed token sentences (5 to 60 tokens), each step a
worker takes a batch of sentences and makes its (target, context) pairs with word2vec's random window (1 to
``--window-max`` on each side), so the pairs a step differ from worker to worker; each pair gets ``--negatives`` noise
words drawn from the unigram distribution to the 3/4 power. Two tables (``tf.Variable``: target and context vectors)
looked up with ``tf.nn.embedding_lookup``, the context table once for the true contexts and the noise words together;
sigmoid cross-entropy on the dot products; plain SGD. One input pipeline per worker from
``distribute_datasets_from_function``, ``tf.function(reduce_retracing=True)`` around ``strategy.run``. The three
lines dagprof needs are marked. Run one process per worker with TF_CONFIG set (bench/bench_frameworks.py does):
``python tf_skipgram_negative.py --out RUN``.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--sentences", type=int, default=8, help="per worker and step")
ap.add_argument("--vocab", type=int, default=30000)
ap.add_argument("--dim", type=int, default=64)
ap.add_argument("--window-max", type=int, default=4)
ap.add_argument("--negatives", type=int, default=4)
ap.add_argument("--window", default="8:16")
args = ap.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
ranks = np.arange(1, args.vocab + 1)
noise = ranks ** -1.0 / np.sum(ranks ** -1.0)  # Zipf's law for the corpus
noise_34 = noise ** 0.75 / np.sum(noise ** 0.75)  # word2vec's noise distribution


def pairs(seed: int):
    """Batches of (targets, contexts, negatives): the skip-gram pairs of ``--sentences`` sentences."""
    rng = np.random.default_rng(seed)
    while True:
        tgt, ctx = [], []
        for _ in range(args.sentences):
            sent = rng.choice(args.vocab, size=int(rng.integers(5, 61)), p=noise)
            for i in range(len(sent)):
                b = int(rng.integers(1, args.window_max + 1))
                for j in range(max(0, i - b), min(len(sent), i + b + 1)):
                    if j != i:
                        tgt.append(sent[i])
                        ctx.append(sent[j])
        neg = rng.choice(args.vocab, size=(len(tgt), args.negatives), p=noise_34)
        yield np.array(tgt, "int64"), np.array(ctx, "int64"), neg.astype("int64")


def make_ds(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    return tf.data.Dataset.from_generator(lambda: pairs(11 + ctx.input_pipeline_id), output_signature=(
        tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None, args.negatives], tf.int64))).prefetch(2)


batches = iter(strategy.distribute_datasets_from_function(make_ds))

with strategy.scope():
    target_vecs = tf.Variable(tf.random.uniform((args.vocab, args.dim), -0.5 / args.dim, 0.5 / args.dim), name="target_vecs")
    context_vecs = tf.Variable(tf.zeros((args.vocab, args.dim)), name="context_vecs")
    opt = tf.keras.optimizers.SGD(0.5)


@tf.function(reduce_retracing=True)
def train_step(tgt, ctx, neg):
    def replica_step(tgt, ctx, neg):
        n = tf.shape(tgt)[0]
        with tf.GradientTape() as tape:
            t = tf.nn.embedding_lookup(target_vecs, tgt)  # [n, d]
            c = tf.nn.embedding_lookup(context_vecs, tf.concat([ctx, tf.reshape(neg, [-1])], 0))  # true contexts, then noise
            pos, negs = c[:n], tf.reshape(c[n:], [n, args.negatives, args.dim])
            logits = tf.concat([tf.reduce_sum(t * pos, -1, keepdims=True), tf.einsum("nd,nkd->nk", t, negs)], 1)
            labels = tf.concat([tf.ones([n, 1]), tf.zeros([n, args.negatives])], 1)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits)) / strategy.num_replicas_in_sync
        grads = tape.gradient(loss, [target_vecs, context_vecs])
        opt.apply_gradients(zip(grads, [target_vecs, context_vecs]))
        return loss
    return strategy.reduce("SUM", strategy.run(replica_step, args=(tgt, ctx, neg)), axis=None)


with tf_profile.tf_profile(args.out, steps=args.window) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        tgt, ctx, neg = next(batches)
        with prof.step(step):  # dagprof (3/3)
            loss = train_step(tgt, ctx, neg)
        n = strategy.experimental_local_results(tgt)[0].shape[0]
        tf.print("step", step, "pairs", n, "loss", loss)  # this worker's pairs: n target rows, n x (1 + negatives) context rows
