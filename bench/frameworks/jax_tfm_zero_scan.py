"""A user's JAX script: a small causal transformer language model (token embedding tied to the output, 2 pre-norm blocks
whose weights are stacked on a leading layer axis and run by ``lax.scan``, a learned position table) on a synthetic
token stream, trained ZeRO-1 style by hand under ``jax.shard_map``: each process keeps its shard of every parameter and of
its Adam moments (the stacked weights split on their second axis, the embedding on its rows). A step all-gathers the
parameters once, before the scan (``lax.all_gather``, tiled), takes the gradient of its batch, flattens it
(``ravel_pytree``) and all-reduces it in one ``lax.psum`` (one collective, not one a leaf), clips the mean gradient by
its global norm, cuts its own shard out of each leaf (``lax.axis_index``) and applies AdamW written with
``jax.tree.map``; each process logs its own loss every 4 steps (no collective for it).
Habits the other JAX scripts do not have: a scan over layers with its collectives outside the loop, per-leaf
``PartitionSpec`` pytrees, one flattened gradient all-reduce, hand-written AdamW with bias correction.

Two processes on this host (gloo collectives): ``python jax_tfm_zero_scan.py --out RUN --rank R --world N --port P``.
"""
import argparse
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
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
V, D, F, L, T, B, HEADS = 256, 128, 256, 2, 32, 8, 4  # B: sequences per process


def init(rng):
    s = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[-2])).astype(np.float32)  # noqa: E731
    return {"emb": s(V, D), "pos": (0.02 * rng.standard_normal((T, D))).astype(np.float32),
            "blocks": {"ln1": np.ones((L, D), np.float32), "qkv": s(L, D, 3 * D), "o": s(L, D, D),
                       "ln2": np.ones((L, D), np.float32), "up": s(L, D, F), "down": s(L, F, D)},
            "ln_f": np.ones((D,), np.float32)}


def spec(x):
    """Where each leaf is split: the stacked weights on their second axis, the embedding on its rows."""
    return P(None, "dp") if x.ndim >= 2 and x.shape[0] == L else P("dp")


full = init(np.random.default_rng(0))
specs = jax.tree.map(spec, full)
params = jax.tree.map(lambda v, sp: jax.device_put(jnp.asarray(v), NamedSharding(mesh, sp)), full, specs)
opt = {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params), "t": jnp.zeros((), jnp.int32)}


def norm(x, scale):
    return scale * (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)


def block(h, w):
    a = norm(h, w["ln1"])
    q, k, v = jnp.split(a @ w["qkv"], 3, axis=-1)
    heads = lambda z: z.reshape(*z.shape[:-1], HEADS, D // HEADS)  # noqa: E731
    att = jnp.einsum("bqhd,bkhd->bhqk", heads(q), heads(k)) / np.sqrt(D // HEADS)
    att = jnp.where(jnp.tril(jnp.ones((T, T), bool)), att, -1e9)
    h = h + jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att, -1), heads(v)).reshape(h.shape) @ w["o"]
    return h + jax.nn.gelu(norm(h, w["ln2"]) @ w["up"]) @ w["down"], None


def loss_fn(p, tokens):
    h = p["emb"][tokens[:, :-1]] + p["pos"][: T - 1]
    h = jnp.pad(h, ((0, 0), (0, 1), (0, 0)))  # T positions for the mask
    h, _ = jax.lax.scan(block, h, p["blocks"])
    logits = norm(h[:, :-1], p["ln_f"]) @ p["emb"].T
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))


def gather(x, sp):
    return jax.lax.all_gather(x, "dp", axis=0 if sp == P("dp") else 1, tiled=True)


def own_shard(x, sp):
    """This process's slice of a whole leaf, as ``spec`` splits it."""
    axis = 0 if sp == P("dp") else 1
    n = x.shape[axis] // args.world
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index("dp") * n, n, axis)


@jax.jit
@partial(jax.shard_map, mesh=mesh, in_specs=(specs, {"m": specs, "v": specs, "t": P()}, P("dp")),
         out_specs=(specs, {"m": specs, "v": specs, "t": P()}, P("dp")))
def train_step(p_shard, o, tokens):
    p = jax.tree.map(gather, p_shard, specs)  # the whole model, once, outside the scan
    loss, g = jax.value_and_grad(loss_fn)(p, tokens)
    flat, unflatten = ravel_pytree(g)
    g = unflatten(jax.lax.psum(flat, "dp") / args.world)  # one all-reduce for the whole gradient
    scale = jnp.minimum(1.0, 1.0 / (jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g))) + 1e-6))
    g = jax.tree.map(lambda x, sp: own_shard(x * scale, sp), g, specs)
    t = o["t"] + 1
    m = jax.tree.map(lambda m, x: 0.9 * m + 0.1 * x, o["m"], g)
    v = jax.tree.map(lambda v, x: 0.999 * v + 0.001 * x * x, o["v"], g)
    lr = 3e-3 * jnp.minimum(1.0, t / 4.0)
    step = lambda w, m, v: w - lr * ((m / (1 - 0.9 ** t)) / (jnp.sqrt(v / (1 - 0.999 ** t)) + 1e-8) + 0.01 * w)  # noqa: E731
    return jax.tree.map(step, p_shard, m, v), {"m": m, "v": v, "t": t}, loss[None]


rng = np.random.default_rng(1 + args.rank)
stream = rng.integers(0, V, size=(args.steps, B, T)).astype(np.int32)
shard = NamedSharding(mesh, P("dp"))
a, b = (int(s) for s in args.window.split(":"))
with jax_profile(args.out, steps=(a, b), params=full) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        with prof.step(i):  # dagprof (3/3)
            tokens = jax.make_array_from_process_local_data(shard, stream[i])
            params, opt, loss = train_step(params, opt, tokens)
            jax.block_until_ready(params)
        if i % 4 == 0:
            print(f"step {i} loss {float(loss.addressable_shards[0].data[0]):.4f}", flush=True)
