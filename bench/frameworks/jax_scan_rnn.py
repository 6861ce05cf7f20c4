"""A user's JAX script: an Elman-style GRU written by hand and unrolled with ``lax.scan``, trained by truncated
backpropagation through time: each step takes the next chunk of a long sequence and the hidden state the last step
left, data parallel with ``shard_map``. Habits: ``jax.value_and_grad(..., has_aux=True)`` returning the final hidden
state and the accuracy beside the loss, the gradients summed with ``lax.psum`` and divided by hand, the metrics
averaged with one ``lax.pmean`` on a tuple, SGD with Nesterov momentum, and parameters, momentum and the carried hidden
state donated (``donate_argnums``).

Two processes on this host (gloo collectives): ``python jax_scan_rnn.py --out RUN --rank R --world N --port P``.
"""
import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dagprof.collect.hooks.jax_profile import jax_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rank", type=int, required=True)
ap.add_argument("--world", type=int, default=2)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--coordinator", default="127.0.0.1", help="rank 0's host (its address)")
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("dp",))
IN, H, OUT, CHUNK, B = 40, 128, 40, 20, 16

rng = np.random.default_rng(5)
params = {"wx": rng.normal(0, 0.1, (IN, 3 * H)), "wh": rng.normal(0, 0.05, (H, 3 * H)), "b": np.zeros(3 * H),
          "wo": rng.normal(0, 0.1, (H, OUT)), "bo": np.zeros(OUT)}
params = jax.tree.map(lambda a: jax.device_put(jnp.asarray(a, jnp.float32), NamedSharding(mesh, P())), params)
momentum = jax.tree.map(jnp.zeros_like, params)


def gru(p, h, x_t):
    zx, rx, nx = jnp.split(x_t @ p["wx"] + p["b"], 3, axis=-1)
    zh, rh, nh = jnp.split(h @ p["wh"], 3, axis=-1)
    z, r = jax.nn.sigmoid(zx + zh), jax.nn.sigmoid(rx + rh)
    h = (1 - z) * h + z * jnp.tanh(nx + r * nh)
    return h, h @ p["wo"] + p["bo"]


def loss_fn(p, h0, xs, ys):
    h, logits = jax.lax.scan(functools.partial(gru, p), h0, jnp.swapaxes(xs, 0, 1))  # time-major
    logits = jnp.swapaxes(logits, 0, 1)
    loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ys[..., None], -1))
    return loss, (jax.lax.stop_gradient(h), jnp.mean(jnp.argmax(logits, -1) == ys))


def step(p, mom, h0, xs, ys):
    (loss, (h, acc)), g = jax.value_and_grad(loss_fn, has_aux=True)(p, h0, xs, ys)
    n = jax.lax.psum(1, "dp")
    g = jax.tree.map(lambda t: jax.lax.psum(t, "dp") / n, g)
    loss, acc = jax.lax.pmean((loss, acc), "dp")
    mom = jax.tree.map(lambda m, t: 0.9 * m + t, mom, g)
    p = jax.tree.map(lambda w, m, t: w - 0.05 * (t + 0.9 * m), p, mom, g)
    return p, mom, h, loss, acc


D = P("dp")
train = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P(), D, D, D), out_specs=(P(), P(), D, P(), P())),
                donate_argnums=(0, 1, 2))

local = np.random.default_rng(50 + args.rank)
seq = local.integers(0, IN, (B, CHUNK * 8 + 1))
onehot = np.eye(IN, dtype=np.float32)
h = jax.make_array_from_process_local_data(NamedSharding(mesh, D), np.zeros((B, H), np.float32))


def chunk(i):
    s = (i % 8) * CHUNK
    xs = jax.make_array_from_process_local_data(NamedSharding(mesh, D), onehot[seq[:, s:s + CHUNK]])
    ys = jax.make_array_from_process_local_data(NamedSharding(mesh, D), seq[:, s + 1:s + CHUNK + 1].astype(np.int32))
    return xs, ys


with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        xs, ys = chunk(i)
        with prof.step(i):  # dagprof (3/3)
            params, momentum, h, loss, acc = train(params, momentum, h, xs, ys)
            jax.block_until_ready((params, h))
        if i % 8 == 7 and args.rank == 0:
            print(f"step {i}: loss {float(loss):.3f} acc {float(acc):.3f}", flush=True)
