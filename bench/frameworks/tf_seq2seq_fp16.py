"""A user's TensorFlow script: a GRU encoder-decoder (seq2seq) that learns to reverse token sequences, trained with
teacher forcing in a custom loop under MultiWorkerMirroredStrategy.

Habits it exercises that the other TF scripts do not: the ``mixed_float16`` precision policy (float16 compute,
float32 variables) with Keras 3's ``LossScaleOptimizer`` (dynamic loss scale: ``scale_loss`` before the tape's
gradient, the optimizer unscaling and skipping a step whose gradients are not finite), a functional model of two
inputs whose encoder hands its final state to the decoder, ``tf.function(jit_compile=False, reduce_retracing=True)``,
the optimizer's ``global_clipnorm``, a distributed dataset iterated with ``next(iterator)`` inside the loop, and the
per-replica losses and token accuracies returned together and summed with ``strategy.reduce`` every step (a user
printing a running mean). ``--steps-per-call N`` runs N steps in each call as TF's tutorial writes it (a ``tf.range``
loop around the step). ``python tf_seq2seq_fp16.py --out RUN`` per worker, TF_CONFIG set.
"""
import argparse

import numpy as np
import tensorflow as tf

from dagprof.collect.hooks.tf_profile import tf_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--window", default="6:14", help="the profiled steps A:B")
ap.add_argument("--steps-per-call", type=int, default=0, help="N: a tf.range loop of N steps a call; 0: one step a call, no loop")
args = ap.parse_args()

tf.keras.mixed_precision.set_global_policy("mixed_float16")
strategy = tf.distribute.MultiWorkerMirroredStrategy()
VOCAB, LEN, EMB, UNITS = 1000, 20, 64, 128
GLOBAL_BATCH = args.batch * strategy.num_replicas_in_sync

with strategy.scope():
    src = tf.keras.Input((LEN,), dtype="int32", name="src")
    tgt_in = tf.keras.Input((LEN,), dtype="int32", name="tgt_in")
    enc = tf.keras.layers.Embedding(VOCAB, EMB, name="src_embed")(src)
    _, state = tf.keras.layers.GRU(UNITS, return_state=True, name="encoder")(enc)
    dec = tf.keras.layers.Embedding(VOCAB, EMB, name="tgt_embed")(tgt_in)
    dec = tf.keras.layers.GRU(UNITS, return_sequences=True, name="decoder")(dec, initial_state=state)
    logits = tf.keras.layers.Dense(VOCAB, name="proj")(dec)
    logits = tf.keras.layers.Activation("linear", dtype="float32", name="logits_f32")(logits)  # softmax in float32
    model = tf.keras.Model([src, tgt_in], logits)
    opt = tf.keras.optimizers.LossScaleOptimizer(tf.keras.optimizers.Adam(2e-3, global_clipnorm=1.0))


def make_dataset(ctx_unused=None):
    rng = np.random.default_rng(3)
    s = rng.integers(2, VOCAB, (GLOBAL_BATCH * 8, LEN)).astype(np.int32)
    t = s[:, ::-1]
    t_in = np.concatenate([np.ones((len(s), 1), np.int32), t[:, :-1]], axis=1)  # 1 = start token
    ds = tf.data.Dataset.from_tensor_slices(((s, t_in), t)).repeat().batch(GLOBAL_BATCH, drop_remainder=True)
    return ds.prefetch(2)


iterator = iter(strategy.experimental_distribute_dataset(make_dataset()))


def replica_step(inputs, target):
    with tf.GradientTape() as tape:
        out = model(inputs, training=True)
        per_tok = tf.keras.losses.sparse_categorical_crossentropy(target, out, from_logits=True)
        loss = tf.nn.compute_average_loss(tf.reduce_mean(per_tok, axis=1), global_batch_size=GLOBAL_BATCH)
        scaled = opt.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(out, -1, output_type=tf.int32), target), tf.float32))
    return loss, correct


@tf.function(jit_compile=False, reduce_retracing=True)
def train_step(it):
    inputs, target = next(it)
    per_loss, per_correct = strategy.run(replica_step, args=(inputs, target))
    return (strategy.reduce(tf.distribute.ReduceOp.SUM, per_loss, axis=None),
            strategy.reduce(tf.distribute.ReduceOp.SUM, per_correct, axis=None))


@tf.function(jit_compile=False, reduce_retracing=True)
def train_steps(it, n):
    loss = correct = tf.constant(0.0)
    for _ in tf.range(n):
        loss, correct = train_step(it)
    return loss, correct


running = []
calls = args.steps // max(args.steps_per_call, 1)
with tf_profile(args.out, steps=args.window, model=model) as prof:  # dagprof (2/3)
    for call in range(calls):
        with prof.step(call):  # dagprof (3/3)
            if args.steps_per_call:
                loss, correct = train_steps(iterator, tf.constant(args.steps_per_call))
            else:
                loss, correct = train_step(iterator)
        running.append(float(loss))
        if call % 10 == 0 and strategy.cluster_resolver.task_id == 0:
            acc = float(correct) / (GLOBAL_BATCH * LEN)
            print(f"call {call}: loss {np.mean(running[-10:]):.3f} acc {acc:.3f} scale {opt.dynamic_scale.numpy():.0f}",
                  flush=True)
