"""A user's JAX script: a tiny vision transformer (patch embedding, 2 pre-norm encoder blocks with multi-head
self-attention written with ``jnp.einsum``, a class token, a learned position table) on synthetic 16x16 images,
trained with optax, data parallel over the processes with the modern sharding API.
Habits it exercises that the other JAX scripts do not: ``optax`` (``chain(clip_by_global_norm, adamw)`` with a
``warmup_cosine_decay_schedule``, wrapped in ``optax.MultiSteps(every_k_schedule=2)``: gradient accumulation, whose
update is a ``lax.cond`` in the compiled step), ``jax.make_mesh`` (its axis ``Auto``: XLA's partitioner, not explicit sharding types)
and ``jax.sharding.set_mesh``, ``jax.jit`` with
no ``in_shardings`` (the shardings come from the committed arguments), ``jax.lax.with_sharding_constraint`` on the
batch inside the step, the parameters and optimizer state donated, dropout keyed by ``jax.random.fold_in(key, step)``,
and the loss logged every 5 steps with ``jax.device_get``.
Two processes on this host (gloo collectives): ``python jax_vit_optax.py --out RUN --rank R --world N --port P``.
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from dagprof.collect.hooks.jax_profile import jax_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rank", type=int, required=True)
ap.add_argument("--world", type=int, default=2)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--coordinator", default="127.0.0.1", help="rank 0's host (its address)")
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=32, help="per process")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
PATCH, DIM, HEADS, DEPTH, CLASSES = 4, 64, 4, 2, 10
TOKENS = (16 // PATCH) ** 2 + 1


def init(key):
    k = iter(jax.random.split(key, 4 + 6 * DEPTH))
    nrm = lambda shape, scale=0.02: scale * jax.random.normal(next(k), shape)  # noqa: E731
    blocks = [{"ln1": {"g": jnp.ones(DIM), "b": jnp.zeros(DIM)}, "qkv": nrm((DIM, 3 * DIM)), "proj": nrm((DIM, DIM)),
               "ln2": {"g": jnp.ones(DIM), "b": jnp.zeros(DIM)}, "fc1": nrm((DIM, 4 * DIM)), "fc2": nrm((4 * DIM, DIM))}
              for _ in range(DEPTH)]
    return {"patch": nrm((PATCH * PATCH * 3, DIM)), "cls": nrm((1, 1, DIM)), "pos": nrm((1, TOKENS, DIM)),
            "blocks": blocks, "ln": {"g": jnp.ones(DIM), "b": jnp.zeros(DIM)}, "head": nrm((DIM, CLASSES))}


def norm(x, p):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return p["g"] * (x - mu) * jax.lax.rsqrt(var + 1e-6) + p["b"]


def forward(p, images, key, train):
    n = images.shape[0]
    x = images.reshape(n, 4, PATCH, 4, PATCH, 3).transpose(0, 1, 3, 2, 4, 5).reshape(n, 16, -1) @ p["patch"]
    x = jnp.concatenate([jnp.broadcast_to(p["cls"], (n, 1, DIM)), x], 1) + p["pos"]
    for i, b in enumerate(p["blocks"]):
        q, kk, v = jnp.split(norm(x, b["ln1"]) @ b["qkv"], 3, -1)
        q, kk, v = (t.reshape(n, TOKENS, HEADS, DIM // HEADS) for t in (q, kk, v))
        att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, kk) / np.sqrt(DIM // HEADS), -1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(n, TOKENS, DIM) @ b["proj"]
        h = jax.nn.gelu(norm(x, b["ln2"]) @ b["fc1"])
        if train:
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.9, h.shape)
            h = jnp.where(keep, h / 0.9, 0)
        x = x + h @ b["fc2"]
    return norm(x[:, 0], p["ln"]) @ p["head"]


def loss_fn(p, images, labels, key):
    logits = forward(p, images, key, True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-3, warmup_steps=5, decay_steps=200)
tx = optax.MultiSteps(optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.05)),
                      every_k_schedule=2)


def train_step(params, opt_state, images, labels, key):
    images = jax.lax.with_sharding_constraint(images, NamedSharding(mesh, P("data")))
    loss, grads = jax.value_and_grad(loss_fn)(params, images, labels, key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


with jax.sharding.set_mesh(mesh):
    repl, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    params = jax.device_put(init(jax.random.key(0)), repl)
    opt_state = jax.device_put(tx.init(params), repl)
    step = jax.jit(train_step, donate_argnums=(0, 1))
    rng, base = np.random.default_rng(100 + args.rank), jax.random.key(1)
    with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
        for i in range(args.steps):
            images = jax.make_array_from_process_local_data(data, rng.standard_normal((args.batch, 16, 16, 3), np.float32))
            labels = jax.make_array_from_process_local_data(data, rng.integers(0, CLASSES, args.batch).astype(np.int32))
            with prof.step(i):  # dagprof (3/3)
                params, opt_state, loss = step(params, opt_state, images, labels, jax.random.fold_in(base, i))
                jax.block_until_ready(params)
            if i % 5 == 0 and args.rank == 0:
                print(f"step {i}: loss {float(jax.device_get(loss)):.4f}", flush=True)
