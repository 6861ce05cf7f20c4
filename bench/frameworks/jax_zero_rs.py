"""A user's JAX script: a 3-layer MLP trained ZeRO-style by hand under ``shard_map``: each process keeps its shard of
every parameter (leading axis) and of its momentum; a step all-gathers the parameters (``lax.all_gather``, tiled), takes
the gradient of its micro-batch, reduce-scatters it (``lax.psum_scatter``, tiled: the sum of the gradients' own shard)
and updates its shard with SGD + momentum. No all-reduce carries a gradient: the reduce-scatter's bytes are its whole
input, the all-gather's its gathered result (as dagprof counts them, ``CommKind.event_bytes``).

Two processes on this host (gloo collectives): ``python jax_zero_rs.py --out RUN --rank R --world N --port P``.
"""
import argparse
from functools import partial

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
ap.add_argument("--hidden", type=int, default=512)
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("dp",))
IN, H, OUT, BATCH = 256, args.hidden, 16, 32  # BATCH: per process

rng = np.random.default_rng(0)
full = {"w1": rng.standard_normal((IN, H)) / np.sqrt(IN), "w2": rng.standard_normal((H, H)) / np.sqrt(H),
        "w3": rng.standard_normal((H, OUT)) / np.sqrt(H)}
full = {k: v.astype(np.float32) for k, v in full.items()}
shard = NamedSharding(mesh, P("dp"))
params = {k: jax.device_put(jnp.asarray(v), shard) for k, v in full.items()}
momentum = {k: jax.device_put(jnp.zeros_like(v), shard) for k, v in full.items()}


def loss_fn(p, x, y):
    h = jax.nn.gelu(x @ p["w1"])
    h = jax.nn.gelu(h @ p["w2"])
    return jnp.mean((h @ p["w3"] - y) ** 2)


@jax.jit
@partial(jax.shard_map, mesh=mesh, in_specs=(P("dp"), P("dp"), P("dp"), P("dp")), out_specs=(P("dp"), P("dp"), P()))
def train_step(p_shard, m_shard, x, y):
    p = {k: jax.lax.all_gather(v, "dp", axis=0, tiled=True) for k, v in p_shard.items()}  # the whole parameters
    loss, g = jax.value_and_grad(loss_fn)(p, x, y)
    g = {k: jax.lax.psum_scatter(v, "dp", scatter_dimension=0, tiled=True) / args.world for k, v in g.items()}  # own shard
    m = {k: 0.9 * m_shard[k] + g[k] for k in g}
    return {k: p_shard[k] - 0.01 * m[k] for k in m}, m, jax.lax.pmean(loss, "dp")


x = jax.make_array_from_process_local_data(shard, rng.standard_normal((BATCH, IN)).astype(np.float32))
y = jax.make_array_from_process_local_data(shard, rng.standard_normal((BATCH, OUT)).astype(np.float32))

with jax_profile(args.out, steps=(6, 14), params=full) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        with prof.step(i):  # dagprof (3/3)
            params, momentum, loss = train_step(params, momentum, x, y)
            jax.block_until_ready(params)
