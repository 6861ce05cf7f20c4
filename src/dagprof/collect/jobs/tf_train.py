"""A small real TensorFlow job: MultiWorkerMirroredStrategy on CPU workers of this host, profiled by dagprof.

Records the TensorFlow test fixtures and runs in the opt-in integration test::

    python -m dagprof.collect.jobs.tf_train --out RUN --workers 2 --mode loop   # custom strategy.run loop (Keras 3)
    python -m dagprof.collect.jobs.tf_train --out RUN --workers 2 --mode fit    # Keras fit (tf-keras, TF_USE_LEGACY_KERAS=1)

The launcher starts one process per worker with ``TF_CONFIG`` on 127.0.0.1 (free ports), waits
at most ``--timeout`` seconds and kills every worker if one hangs. Needs ``tensorflow-cpu`` (and
``tf-keras`` for ``fit``) in the running Python; dagprof's core never imports TensorFlow.
Model: conv(16) -> conv(32) -> max-pool -> dense(64) -> dense(10) on 24x24x3 inputs, about
80 k parameters, synthetic data, SGD; one intra-op and two inter-op threads per worker.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from ...traces.steps import parse_steps
from .netns import free_ports, stop_all


def launch(args: argparse.Namespace) -> int:
    """Start ``--workers`` worker processes; 0 when all finished, else the first failure's code."""
    ports = free_ports(args.workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for rank in range(args.workers):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}}))
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if args.mode == "fit":
            env["TF_USE_LEGACY_KERAS"] = "1"  # Keras 3 fit does not run under MultiWorkerMirroredStrategy
        cmd = [sys.executable, "-m", "dagprof.collect.jobs.tf_train", "--rank", str(rank), *args.passthrough]
        procs.append(subprocess.Popen(cmd, env=env))
    return wait_all(procs, args.timeout, "tf_train")


def wait_all(procs: list[subprocess.Popen], timeout: float, who: str) -> int:
    """Wait for every process; the first failure (or the timeout) stops the others. 0 when all succeeded."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = next((c for c in codes if c not in (None, 0)), None)
            if bad is not None:
                print(f"{who}: a worker failed (exit {bad}); stopping the others", file=sys.stderr)
                return bad
            if all(c == 0 for c in codes):
                return 0
            if time.monotonic() > deadline:
                print(f"{who}: the workers ran past --timeout {timeout:.0f} s; stopping them", file=sys.stderr)
                return 124
            time.sleep(0.2)
    finally:
        stop_all(procs)


def worker(args: argparse.Namespace) -> int:
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from ..hooks.tf_profile import keras_callback, tf_profile  # noqa: PLC0415

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras = tf.keras
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((24, 24, 3)),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv1"),
            keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
            keras.layers.MaxPooling2D(2, name="pool"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(64, activation="relu", name="fc1"),
            keras.layers.Dense(10, name="fc2"),
        ])
    rng = np.random.default_rng(args.rank)
    n = args.batch * args.workers
    x = rng.standard_normal((n, 24, 24, 3), dtype=np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    window = args.profile
    if args.mode == "fit":
        with strategy.scope():
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(n).repeat()
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        ds = ds.with_options(opts)
        model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=[keras_callback(args.out, window)])
        return 0
    with strategy.scope():
        opt = keras.optimizers.SGD(0.01)
    xb, yb = tf.constant(x[: args.batch]), tf.constant(y[: args.batch])

    @tf.function
    def train_step(xs, ys):
        def replica_step(xs, ys):
            with tf.GradientTape() as tape:
                logits = model(xs, training=True)
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(ys, logits, from_logits=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.run(replica_step, args=(xs, ys))

    with tf_profile(args.out, steps=window, model=model) as prof:
        for step in range(args.steps):
            with prof.step(step):
                train_step(xb, yb)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dagprof.collect.jobs.tf_train", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="run folder to write")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mode", choices=("loop", "fit"), default="loop")
    ap.add_argument("--steps", type=int, default=12, help="training steps in all")
    ap.add_argument("--profile", type=parse_steps, default="6:10", help="steps to profile: A:B = steps A..B-1")
    ap.add_argument("--batch", type=int, default=16, help="per-worker batch")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before the launcher kills the workers")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank is not None:
        return worker(args)
    args.passthrough = ["--out", os.path.abspath(args.out), "--workers", str(args.workers), "--mode", args.mode,
                        "--steps", str(args.steps), "--profile", f"{args.profile.start}:{args.profile.stop}", "--batch", str(args.batch)]
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
