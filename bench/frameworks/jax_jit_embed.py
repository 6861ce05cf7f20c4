"""A user's JAX script: a bag-of-words text classifier (an 8,000 x 32 embedding, two dense layers), Adam written by
hand, data parallel by plain ``jax.jit``: the batch is sharded over the processes, the parameters replicated, and
XLA's partitioner inserts the gradient all-reduces itself (no ``shard_map``, no ``pmean``). The loss is read back
every 4 steps, as people log it.

Two processes on this host (gloo collectives): ``python jax_jit_embed.py --out RUN --rank R --world N --port P``.
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dagprof.collect.hooks.jax_profile import jax_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rank", type=int, required=True)
ap.add_argument("--world", type=int, default=2)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--coordinator", default="127.0.0.1", help="rank 0's host (its address)")
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--vocab", type=int, default=8000)
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("batch",))
replicated, sharded = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("batch"))


def global_array(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """Every process holds the whole value; each device takes its slice (all of it when replicated)."""
    shape = value.shape if sharding.spec == PartitionSpec() else (value.shape[0] * args.world, *value.shape[1:])
    full = value if sharding.spec == PartitionSpec() else np.concatenate([value] * args.world)
    return jax.make_array_from_callback(shape, sharding, lambda idx: full[idx])


rng = np.random.default_rng(1)
init = {"embed": rng.normal(0, 0.05, (args.vocab, 32)), "w1": rng.normal(0, 0.1, (32, 256)), "b1": np.zeros(256),
        "w2": rng.normal(0, 0.05, (256, 4)), "b2": np.zeros(4)}
params = {k: global_array(v.astype(np.float32), replicated) for k, v in init.items()}
opt = {"m": jax.tree_util.tree_map(jnp.zeros_like, params), "v": jax.tree_util.tree_map(jnp.zeros_like, params),
       "t": global_array(np.zeros((), np.float32), replicated)}


def loss_fn(p, tokens, labels):
    bag = jnp.mean(p["embed"][tokens], axis=1)  # (batch, 32)
    logits = jax.nn.gelu(bag @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))


@jax.jit
def train_step(p, o, tokens, labels):
    loss, g = jax.value_and_grad(loss_fn)(p, tokens, labels)
    t = o["t"] + 1
    m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, o["m"], g)
    v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, o["v"], g)
    scale = 1e-3 * jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
    p = jax.tree_util.tree_map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + 1e-8), p, m, v)
    return p, {"m": m, "v": v, "t": t}, loss


tokens = global_array(rng.integers(0, args.vocab, (64, 48)).astype(np.int32), sharded)  # 64 documents a process
labels = global_array(rng.integers(0, 4, 64).astype(np.int32), sharded)

with jax_profile(args.out, steps=(6, 14), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        with prof.step(i):  # dagprof (3/3)
            params, opt, loss = train_step(params, opt, tokens, labels)
            jax.block_until_ready(params)
        if i % 4 == 3 and args.rank == 0:
            print(f"step {i}: loss {float(loss):.4f}", flush=True)
