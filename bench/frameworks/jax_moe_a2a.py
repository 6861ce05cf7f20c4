"""A user's JAX script: a mixture-of-experts MLP block with one expert per process (expert parallel) under ``shard_map``:
each process routes its tokens top-1 to a fixed-capacity buffer per expert, ``lax.all_to_all`` sends each expert its
buffer, the expert's FFN runs, a second ``all_to_all`` brings the results back. The router and the embedding are
replicated (their gradients ``psum``med); each expert's weights are its own. Forward and backward: 4 all-to-alls a step.

Two processes on this host (gloo collectives): ``python jax_moe_a2a.py --out RUN --rank R --world N --port P``.
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
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("ep",))
TOKENS, D, F, CAP = 512, 128, 512, 384  # per process: tokens, model width, expert width, capacity per expert
E = args.world

rng = np.random.default_rng(0)
shared = {"embed": rng.standard_normal((D, D)) / np.sqrt(D), "router": rng.standard_normal((D, E)) / np.sqrt(D)}
experts = {"w_in": rng.standard_normal((E, D, F)) / np.sqrt(D), "w_out": rng.standard_normal((E, F, D)) / np.sqrt(F)}
shared = {k: jnp.asarray(v, jnp.float32) for k, v in shared.items()}
experts = {k: jax.device_put(jnp.asarray(v, jnp.float32), NamedSharding(mesh, P("ep"))) for k, v in experts.items()}


def moe(s, e, x):
    h = x @ s["embed"]
    gate = jax.nn.softmax(h @ s["router"])  # (T, E)
    choice = jnp.argmax(gate, -1)
    onehot = jax.nn.one_hot(choice, E)
    slot = (jnp.cumsum(onehot, 0) - 1) * onehot  # each token's place in its expert's buffer
    keep = (slot < CAP) * onehot
    dispatch = keep[:, :, None] * jax.nn.one_hot(slot, CAP)  # (T, E, CAP)
    buf = jnp.einsum("tec,td->ecd", dispatch, h)  # (E, CAP, D): what this process sends each expert
    buf = jax.lax.all_to_all(buf, "ep", split_axis=0, concat_axis=0, tiled=True)  # (E, CAP, D): every process's tokens for mine
    y = jax.nn.gelu(buf @ e["w_in"][0]) @ e["w_out"][0]
    y = jax.lax.all_to_all(y, "ep", split_axis=0, concat_axis=0, tiled=True)  # back to their processes
    out = jnp.einsum("tec,ecd->td", dispatch * gate[:, :, None], y)
    return h + out


def loss_fn(s, e, x, t):
    return jnp.mean((moe(s, e, x) - t) ** 2)


@jax.jit
@partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("ep"), P("ep"), P("ep")), out_specs=(P(), P("ep"), P()))
def train_step(s, e, x, t):
    loss, (gs, ge) = jax.value_and_grad(loss_fn, argnums=(0, 1))(s, e, x, t)
    gs = jax.lax.pmean(gs, "ep")  # the replicated weights: one gradient on every process
    return (jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, s, gs), jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, e, ge),
            jax.lax.pmean(loss, "ep"))


batch = NamedSharding(mesh, P("ep"))
x = jax.make_array_from_process_local_data(batch, rng.standard_normal((TOKENS, D)).astype(np.float32))
t = jax.make_array_from_process_local_data(batch, rng.standard_normal((TOKENS, D)).astype(np.float32))

with jax_profile(args.out, steps=(6, 14)) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        with prof.step(i):  # dagprof (3/3)
            shared, experts, loss = train_step(shared, experts, x, t)
            jax.block_until_ready(experts)
