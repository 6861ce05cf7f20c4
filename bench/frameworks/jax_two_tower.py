"""A user's JAX script: a two-tower retrieval model (a query tower over hashed query tokens, an item tower over an item-id
embedding and item features, both ending in L2-normalised vectors) trained with an in-batch softmax over the towers'
dot products, data parallel by ``jax.jit`` over a ``Mesh``, AdamW behind a global-norm clip written by hand (the venv
has no optax).

Habits it exercises that the other JAX scripts do not: a global-norm clip then AdamW with a warm-up-cosine learning rate
computed from the step count inside the jitted update, a parameter tree of two towers built by a helper, a temperature
learned as a parameter, and the
batch gathered across processes for the in-batch negatives (``jax.lax.with_sharding_constraint`` to replicated: XLA
all-gathers the towers' outputs beside the gradients' all-reduces). The loss is printed every 4 steps.

Two processes on this host (gloo collectives): ``python jax_two_tower.py --out RUN --rank R --world N --port P``.
"""
import argparse

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
mesh = Mesh(jax.devices(), axis_names=("batch",))
REPL, SPLIT = NamedSharding(mesh, P()), NamedSharding(mesh, P("batch"))
BUCKETS, ITEMS, TOKENS, ITEM_FEAT, DIM, OUT, LOCAL = 4096, 3000, 12, 16, 48, 32, 64


def tower(key, sizes):
    keys = jax.random.split(key, len(sizes) - 1)
    return [{"w": jax.random.normal(k, (a, b)) * (2.0 / a) ** 0.5, "b": jnp.zeros(b)} for k, a, b in zip(keys, sizes[:-1], sizes[1:])]


def run_tower(layers, h):
    for i, layer in enumerate(layers):
        h = h @ layer["w"] + layer["b"]
        h = jax.nn.gelu(h) if i < len(layers) - 1 else h
    return h / jnp.linalg.norm(h, axis=-1, keepdims=True)


k = jax.random.split(jax.random.key(1), 4)  # the same on every process: the replicated parameters agree
params = {"query_emb": jax.random.normal(k[0], (BUCKETS, DIM)) * 0.05, "item_emb": jax.random.normal(k[1], (ITEMS, DIM)) * 0.05,
          "query": tower(k[2], [DIM, 128, OUT]), "item": tower(k[3], [DIM + ITEM_FEAT, 128, 64, OUT]), "log_temp": jnp.array(2.0)}
params = jax.device_put(params, REPL)
opt_state = jax.device_put({"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params), "t": jnp.array(0.0)}, REPL)


def adamw(p, g, s, peak=3e-3, warmup=4.0, decay=200.0, b1=0.9, b2=0.999, wd=1e-4, clip=1.0):
    norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g)))
    g = jax.tree.map(lambda x: x * jnp.minimum(1.0, clip / (norm + 1e-6)), g)
    t = s["t"] + 1.0
    lr = peak * jnp.where(t < warmup, t / warmup, 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum((t - warmup) / decay, 1.0))))
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, s["m"], g)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, s["v"], g)
    p = jax.tree.map(lambda w, m, v: w - lr * ((m / (1 - b1**t)) / (jnp.sqrt(v / (1 - b2**t)) + 1e-8) + wd * w), p, m, v)
    return p, {"m": m, "v": v, "t": t}


def loss_fn(p, q_tokens, item_ids, item_feat):
    q = run_tower(p["query"], p["query_emb"][q_tokens].mean(axis=1))
    i = run_tower(p["item"], jnp.concatenate([p["item_emb"][item_ids], item_feat], axis=-1))
    q, i = (jax.lax.with_sharding_constraint(t, REPL) for t in (q, i))  # every query against every process's items
    logits = q @ i.T * jnp.exp(p["log_temp"])
    return -jnp.mean(jnp.diagonal(jax.nn.log_softmax(logits, axis=-1)))


def update(p, s, q_tokens, item_ids, item_feat):
    loss, g = jax.value_and_grad(loss_fn)(p, q_tokens, item_ids, item_feat)
    p, s = adamw(p, g, s)
    return p, s, loss


train = jax.jit(update, in_shardings=(REPL, REPL, SPLIT, SPLIT, SPLIT), out_shardings=(REPL, REPL, REPL), donate_argnums=(0, 1))
rng = np.random.default_rng(7 + args.rank)  # each process its own pairs

with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            q_tokens = jax.make_array_from_process_local_data(SPLIT, rng.integers(0, BUCKETS, (LOCAL, TOKENS)).astype(np.int32))
            item_ids = jax.make_array_from_process_local_data(SPLIT, rng.integers(0, ITEMS, LOCAL).astype(np.int32))
            item_feat = jax.make_array_from_process_local_data(SPLIT, rng.standard_normal((LOCAL, ITEM_FEAT)).astype(np.float32))
            params, opt_state, loss = train(params, opt_state, q_tokens, item_ids, item_feat)
            jax.block_until_ready(params)
        if step % 4 == 0 and args.rank == 0:
            print(f"step {step}: loss {float(loss):.4f}", flush=True)
