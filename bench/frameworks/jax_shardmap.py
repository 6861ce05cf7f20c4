"""A user's JAX script: a 1-D CNN, data parallel with ``shard_map`` and one ``pmean`` per gradient (several all-reduces).

Two processes on this host (gloo collectives): ``python jax_shardmap.py --out RUN --rank R --world N --port P``.
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from dagprof.collect.hooks.jax_profile import jax_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rank", type=int, required=True)
ap.add_argument("--world", type=int, default=2)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--coordinator", default="127.0.0.1", help="rank 0's host (its address)")
ap.add_argument("--steps", type=int, default=24)
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("data",))

rng = np.random.default_rng(0)
params = {
    "conv1": jnp.asarray(rng.standard_normal((5, 1, 16)) * 0.1, jnp.float32),
    "conv2": jnp.asarray(rng.standard_normal((5, 16, 32)) * 0.1, jnp.float32),
    "dense1": jnp.asarray(rng.standard_normal((32 * 120, 128)) * 0.01, jnp.float32),
    "b1": jnp.zeros(128, jnp.float32),
    "dense2": jnp.asarray(rng.standard_normal((128, 10)) * 0.1, jnp.float32),
}


def loss_fn(p, x, y):
    h = jax.nn.relu(jax.lax.conv_general_dilated(x, p["conv1"], (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC")))
    h = jax.nn.relu(jax.lax.conv_general_dilated(h, p["conv2"], (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC")))
    h = jax.nn.relu(h.reshape(h.shape[0], -1) @ p["dense1"] + p["b1"])
    logits = h @ p["dense2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


def step(p, x, y):
    g = jax.grad(loss_fn)(p, x, y)
    g = {k: jax.lax.pmean(v, "data") for k, v in g.items()}  # one pmean per gradient (XLA may combine them)
    return {k: p[k] - 0.01 * g[k] for k in p}


DATA = PartitionSpec("data")
train = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(PartitionSpec(), DATA, DATA), out_specs=PartitionSpec(), check_vma=False))
batch = 16 * args.world
x = jax.make_array_from_process_local_data(jax.sharding.NamedSharding(mesh, PartitionSpec("data")), rng.standard_normal((16, 128, 1)).astype(np.float32))
y = jax.make_array_from_process_local_data(jax.sharding.NamedSharding(mesh, PartitionSpec("data")), rng.integers(0, 10, 16).astype(np.int32))

with jax_profile(args.out, steps=(6, 14), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        with prof.step(i):  # dagprof (3/3)
            params = train(params, x, y)
            jax.block_until_ready(params)
