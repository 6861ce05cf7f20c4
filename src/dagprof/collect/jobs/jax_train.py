"""A small real JAX job: data-parallel training over CPU processes of this host (gloo collectives), profiled by dagprof.

Records the JAX test fixture and runs in the opt-in integration test::

    python -m dagprof.collect.jobs.jax_train --out RUN --workers 2

The launcher starts one process per worker (``jax.distributed.initialize`` on 127.0.0.1), waits at
most ``--timeout`` seconds and stops every worker if one fails or hangs. Model: a 3-layer MLP
(64 -> 256 -> 256 -> 10, about 85 k parameters) on synthetic data, SGD; the batch is sharded over
the processes and the parameters replicated, so XLA all-reduces the gradients every step.
Needs ``jax`` in the running Python; dagprof's core never imports it.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from ...traces.steps import parse_steps
from .netns import free_ports
from .tf_train import wait_all


def launch(args: argparse.Namespace) -> int:
    port = free_ports(1)[0]
    procs = []
    for rank in range(args.workers):
        cmd = [sys.executable, "-m", "dagprof.collect.jobs.jax_train", "--rank", str(rank), "--port", str(port), *args.passthrough]
        procs.append(subprocess.Popen(cmd, env=dict(os.environ)))
    return wait_all(procs, args.timeout, "jax_train")


def worker(args: argparse.Namespace) -> int:
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import (  # noqa: PLC0415
        Mesh,
        NamedSharding,
        PartitionSpec as P,  # noqa: PLC0415
    )

    from ..hooks.jax_profile import jax_profile  # noqa: PLC0415

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.workers, process_id=args.rank)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    sizes = [64, 256, 256, 10]
    key = jax.random.PRNGKey(0)
    params = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append({"w": jax.random.normal(sub, (a, b)) / np.sqrt(a), "b": jnp.zeros(b)})
    params = jax.device_put(params, replicated)

    def loss(params, x, y):
        h = x
        for layer in params[:-1]:
            h = jax.nn.relu(h @ layer["w"] + layer["b"])
        logits = h @ params[-1]["w"] + params[-1]["b"]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 10), axis=-1))

    @jax.jit
    def train_step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)

    rng = np.random.default_rng(args.rank)
    x = jax.make_array_from_process_local_data(sharded, rng.standard_normal((args.batch, 64), dtype=np.float32))
    y = jax.make_array_from_process_local_data(sharded, rng.integers(0, 10, args.batch).astype(np.int32))
    with jax_profile(args.out, steps=args.profile, params=params) as prof:
        for step in range(args.steps):
            with prof.step(step):
                params = train_step(params, x, y)
                jax.block_until_ready(params)
    jax.distributed.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dagprof.collect.jobs.jax_train", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="run folder to write")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12, help="training steps in all")
    ap.add_argument("--profile", type=parse_steps, default="6:10", help="steps to profile: A:B = steps A..B-1")
    ap.add_argument("--batch", type=int, default=64, help="per-process batch")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before the launcher stops the workers")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank is not None:
        return worker(args)
    args.passthrough = ["--out", os.path.abspath(args.out), "--workers", str(args.workers), "--steps", str(args.steps),
                        "--profile", f"{args.profile.start}:{args.profile.stop}", "--batch", str(args.batch)]
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
