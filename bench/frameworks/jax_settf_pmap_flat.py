"""A user's JAX script: a Set Transformer (Lee et al. 2019, small: an embedding of each set element, two self-attention
blocks over the set, pooling by multi-head attention against a learned seed vector, an MLP head) counting the clusters
in synthetic point sets (2-D points drawn around 1-6 centres, 48 a set), data parallel by ``jax.pmap`` over the
processes' devices.

Habits it exercises that the other JAX scripts do not: gradient accumulation over micro-batches written as a
``lax.scan`` inside the pmapped step that sums each process's own gradients locally (no collective in the loop), then
the whole gradient pytree flattened into one vector with ``jax.flatten_util.ravel_pytree`` and summed by a single
``lax.psum`` (the user's own one-bucket all-reduce), divided by hand and unflattened; per-device randomness by
``jax.random.fold_in(key, lax.axis_index(...))`` (input jitter drawn on the device each step); padding masks in the
attention for sets of different sizes; Adam and a linear warm-up written by hand; the loss ``psum``-ed as a metric.
Two processes on this host (gloo collectives): ``python jax_settf_pmap_flat.py --out RUN --rank R --world N --port P``.
"""
import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from dagprof.collect.hooks.jax_profile import jax_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rank", type=int, required=True)
ap.add_argument("--world", type=int, default=2)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--coordinator", default="127.0.0.1")
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--micro", type=int, default=4, help="micro-batches a step")
ap.add_argument("--batch", type=int, default=16, help="sets per micro-batch per process")
ap.add_argument("--window", default="6:14")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
ndev = jax.local_device_count()
N, D, HEADS, CLASSES = 48, 64, 4, 6


def init(key):
    k = iter(jax.random.split(key, 32))
    dense = lambda i, o: {"w": jax.random.normal(next(k), (i, o)) * i ** -0.5, "b": jnp.zeros(o)}  # noqa: E731
    block = lambda: {"q": dense(D, D), "k": dense(D, D), "v": dense(D, D), "o": dense(D, D),  # noqa: E731
                     "ff1": dense(D, 2 * D), "ff2": dense(2 * D, D), "ln1": jnp.ones(D), "ln2": jnp.ones(D)}
    return {"embed": dense(2, D), "sab1": block(), "sab2": block(), "pma": block(),
            "seed": jax.random.normal(next(k), (1, D)) * 0.1, "head1": dense(D, D), "head2": dense(D, CLASSES)}


def lin(p, x):
    return x @ p["w"] + p["b"]


def norm(x, g):
    return g * (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)


def mab(p, q, kv, mask):
    """Multi-head attention block: queries q over keys/values kv, padded keys masked, residual and feed-forward."""
    b, nq, nk = q.shape[0], q.shape[1], kv.shape[1]
    split = lambda t, n: t.reshape(b, n, HEADS, D // HEADS).transpose(0, 2, 1, 3)  # noqa: E731
    qh, kh, vh = split(lin(p["q"], q), nq), split(lin(p["k"], kv), nk), split(lin(p["v"], kv), nk)
    logits = jnp.einsum("bhqd,bhkd->bhqk", qh, kh) / jnp.sqrt(D // HEADS)
    logits = jnp.where(mask[:, None, None, :], logits, -1e9)
    att = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(logits, -1), vh).transpose(0, 2, 1, 3).reshape(b, nq, D)
    h = norm(q + lin(p["o"], att), p["ln1"])
    return norm(h + lin(p["ff2"], jax.nn.gelu(lin(p["ff1"], h))), p["ln2"])


def loss_fn(p, x, mask, y):
    h = lin(p["embed"], x)
    h = mab(p["sab1"], h, h, mask)
    h = mab(p["sab2"], h, h, mask)
    pooled = mab(p["pma"], jnp.broadcast_to(p["seed"], (x.shape[0], 1, D)), h, mask)[:, 0]
    logits = lin(p["head2"], jax.nn.relu(lin(p["head1"], pooled)))
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


@functools.partial(jax.pmap, axis_name="replicas", donate_argnums=(0, 1))
def train_step(p, opt, x, mask, y, key, step):
    key = jax.random.fold_in(jax.random.fold_in(key, step), jax.lax.axis_index("replicas"))
    x = x + 0.01 * jax.random.normal(key, x.shape)  # jitter drawn on the device

    def micro(acc, batch):
        loss, g = jax.value_and_grad(loss_fn)(p, *batch)
        return jax.tree_util.tree_map(jnp.add, acc, g), loss

    zeros = jax.tree_util.tree_map(jnp.zeros_like, p)
    g, losses = jax.lax.scan(micro, zeros, (x, mask, y))
    flat, unravel = ravel_pytree(g)
    g = unravel(jax.lax.psum(flat, "replicas") / (args.micro * jax.lax.psum(1, "replicas")))
    t = opt["t"] + 1
    lr = 1e-3 * jnp.minimum(1.0, t / 10.0)
    m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, opt["m"], g)
    v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, opt["v"], g)
    new_p = jax.tree_util.tree_map(lambda w, m, v: w - lr * (m / (1 - 0.9 ** t)) / (jnp.sqrt(v / (1 - 0.999 ** t)) + 1e-8), p, m, v)
    return new_p, {"m": m, "v": v, "t": t}, jax.lax.psum(losses.mean(), "replicas")


def point_sets(rng, n):
    """Sets of 16-48 points around 1-6 centres; the label is the number of centres less one."""
    x, mask = np.zeros((n, N, 2), np.float32), np.zeros((n, N), bool)
    y = rng.integers(0, CLASSES, n).astype(np.int32)
    for k in range(n):
        size = rng.integers(16, N + 1)
        centres = rng.uniform(-3, 3, (y[k] + 1, 2))
        x[k, :size] = centres[rng.integers(0, y[k] + 1, size)] + 0.3 * rng.standard_normal((size, 2))
        mask[k, :size] = True
    return x, mask, y


def replicate(tree):
    return jax.tree_util.tree_map(lambda a: np.stack([np.asarray(a)] * ndev), tree)


params = init(jax.random.PRNGKey(0))  # the same key on every process: replicas start alike
zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
opt = replicate({"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)})
params = replicate(params)
keys = replicate(jax.random.PRNGKey(7))
rng = np.random.default_rng(20 + args.rank)
shape = lambda a: a.reshape(ndev, args.micro, args.batch, *a.shape[1:])  # noqa: E731
batches = [tuple(shape(a) for a in point_sets(rng, ndev * args.micro * args.batch)) for _ in range(3)]

a, b = (int(v) for v in args.window.split(":"))
with jax_profile(args.out, steps=(a, b), params=jax.tree_util.tree_map(lambda v: v[0], params)) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        x, mask, y = batches[i % len(batches)]
        with prof.step(i):  # dagprof (3/3)
            params, opt, loss = train_step(params, opt, x, mask, y, keys, np.full(ndev, i, np.int32))
            jax.block_until_ready(params)
        if i % 6 == 5 and args.rank == 0:
            print(f"step {i}: loss {float(loss[0]) / args.world:.3f}", flush=True)
