"""A user's JAX script: a mixture density network (an MLP with layer norm giving the weights, means and log-scales of a
5-component Gaussian mixture over a 2-D target) fitted to a noisy inverse-kinematics toy (the arm's end point from its
two joint angles, asked the other way round: one input, several answers), data parallel over the processes.

Habits it exercises that the other JAX scripts do not: the mixture's negative log-likelihood with ``logsumexp`` and a
scale floor, gradients and the loss averaged by hand inside ``shard_map`` (``lax.psum`` of the sums and of the example
count: the last process's batch is shorter), parameters as a list of per-layer dicts, RMSprop with decoupled weight
decay written by hand, the learning rate a cosine schedule computed on the host and passed in as a float each step (a
new scalar a step, no recompilation), and the loss read back with ``float()`` every 5 steps. Two processes on this host
(gloo collectives): ``python jax_mdn_rmsprop.py --out RUN --rank R --world N --port P``.
"""
import argparse
import math

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
ap.add_argument("--batch", type=int, default=192, help="per process (the last process takes a quarter fewer)")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("data",))
K, WIDTH, DEPTH = 5, 192, 4


def init(key):
    sizes = [2] + [WIDTH] * DEPTH
    keys = jax.random.split(key, DEPTH + 1)
    layers = [{"w": jax.random.normal(k, (a, b)) / np.sqrt(a), "b": jnp.zeros(b), "g": jnp.ones(b)}
              for k, a, b in zip(keys, sizes[:-1], sizes[1:])]
    layers.append({"w": jax.random.normal(keys[-1], (WIDTH, K * 5)) * 0.01, "b": jnp.zeros(K * 5)})
    return layers


def mixture(layers, x):
    h = x
    for p in layers[:-1]:
        h = h @ p["w"] + p["b"]
        h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5) * p["g"]
        h = jax.nn.gelu(h)
    out = h @ layers[-1]["w"] + layers[-1]["b"]
    logit, mean, log_scale = out[:, :K], out[:, K:3 * K].reshape(-1, K, 2), out[:, 3 * K:].reshape(-1, K, 2)
    return jax.nn.log_softmax(logit), mean, jnp.maximum(log_scale, -4.0)


def nll_sum(layers, x, y, mask):
    logw, mean, log_scale = mixture(layers, x)
    z = (y[:, None, :] - mean) * jnp.exp(-log_scale)
    comp = -0.5 * (z ** 2).sum(-1) - log_scale.sum(-1) - math.log(2 * math.pi)
    return -(jax.scipy.special.logsumexp(logw + comp, axis=1) * mask).sum()


def step(layers, sq, x, y, mask, lr):
    total, grads = jax.value_and_grad(nll_sum)(layers, x, y, mask)
    n = jax.lax.psum(mask.sum(), "data")
    grads = jax.tree.map(lambda g: jax.lax.psum(g, "data") / n, grads)
    sq = jax.tree.map(lambda s, g: 0.95 * s + 0.05 * g * g, sq, grads)
    layers = jax.tree.map(lambda p, g, s: p - lr * (g / (jnp.sqrt(s) + 1e-6) + 1e-4 * p), layers, grads, sq)
    return layers, sq, jax.lax.psum(total, "data") / n


def arm(rng, n):
    """The end point of a two-link arm (lengths 1 and 0.7) from random joint angles, noisy: inputs are end points, targets angles."""
    q = rng.uniform([-np.pi, 0.2], [np.pi, np.pi - 0.2], (n, 2))
    end = np.stack([np.cos(q[:, 0]) + 0.7 * np.cos(q.sum(1)), np.sin(q[:, 0]) + 0.7 * np.sin(q.sum(1))], 1)
    return (end + 0.02 * rng.standard_normal(end.shape)).astype(np.float32), q.astype(np.float32)


D = P("data")
train = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P(), D, D, D, P()), out_specs=(P(), P(), P()), check_vma=False),
                donate_argnums=(0, 1))
layers = init(jax.random.key(1))
sq = jax.tree.map(jnp.zeros_like, layers)
rng = np.random.default_rng(100 + args.rank)
real = args.batch - (args.batch // 4 if args.rank == args.world - 1 else 0)
mask = np.zeros(args.batch, np.float32)
mask[:real] = 1.0
data = NamedSharding(mesh, D)
with jax_profile(args.out, steps=(6, 14), params=layers) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        x, y = arm(rng, args.batch)
        lr = 3e-3 * 0.5 * (1 + math.cos(math.pi * i / args.steps))
        xs, ys, ms = (jax.make_array_from_process_local_data(data, a) for a in (x, y, mask))
        with prof.step(i):  # dagprof (3/3)
            layers, sq, loss = train(layers, sq, xs, ys, ms, lr)
            jax.block_until_ready(layers)
        if i % 5 == 4 and args.rank == 0:
            print(f"step {i}: nll {float(loss):.3f} lr {lr:.2e}", flush=True)
