"""A user's JAX script: a small 2-D conv net (three 3x3 conv layers with GELU, strided, global average pooling, a
Dense head) on synthetic 16x16 images, trained fully sharded over the processes (ZeRO-3 / FSDP as JAX's sharding
docs write it): every parameter and its Adam moments sharded along their leading axis with
``NamedSharding(mesh, P("dp"))`` where it divides, replicated where not, the batch sharded too; XLA's partitioner
then all-gathers the weights in the forward and backward and reduce-scatters the gradients.

Habits it exercises that the other JAX scripts do not: sharded parameters and optimizer state (all-gathers and
reduce-scatters, not all-reduces, carry the gradients), gradient accumulation written in Python (a jitted
``grad_fn`` called on 2 micro-batches per step, their sharded gradients summed by a jitted ``add``, then a jitted Adam
``update`` with ``donate_argnums``: 4 programs dispatched a step), the shardings read off the parameters
(``jax.tree_util.tree_map`` of a rule to a pytree of ``NamedSharding``), and the loss fetched with ``.item()`` every
3 steps.

Two processes on this host (gloo collectives): ``python jax_fsdp_conv.py --out RUN --rank R --world N --port P``.
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
ap.add_argument("--micro", type=int, default=2)
ap.add_argument("--window", default="6:14")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("dp",))
REPL, BATCH = NamedSharding(mesh, P()), NamedSharding(mesh, P("dp"))
CLASSES, MB = 10, 16  # MB: a micro-batch per process


def shard_rule(x):
    """FSDP: shard a parameter along its first axis where the processes divide it, else replicate it."""
    return NamedSharding(mesh, P("dp")) if x.ndim and x.shape[0] % args.world == 0 else REPL


def init(key):
    k = jax.random.split(key, 4)
    conv = lambda key, cin, cout: {"w": jax.random.normal(key, (cout, cin, 3, 3)) / np.sqrt(9 * cin), "b": jnp.zeros(cout)}  # noqa: E731
    return {"c1": conv(k[0], 3, 32), "c2": conv(k[1], 32, 64), "c3": conv(k[2], 64, 128),
            "head": {"w": jax.random.normal(k[3], (128, CLASSES)) / np.sqrt(128), "b": jnp.zeros(CLASSES)}}


def apply(p, x):  # x: NCHW
    for name, stride in (("c1", 1), ("c2", 2), ("c3", 2)):
        x = jax.lax.conv_general_dilated(x, p[name]["w"], (stride, stride), "SAME")
        x = jax.nn.gelu(x + p[name]["b"][None, :, None, None])
    return x.mean((2, 3)) @ p["head"]["w"] + p["head"]["b"]


def loss_fn(p, x, y):
    logits = apply(p, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


params = init(jax.random.PRNGKey(0))
SHARD = jax.tree_util.tree_map(shard_rule, params)
params = jax.device_put(params, SHARD)
opt = {"m": jax.tree_util.tree_map(jnp.zeros_like, params), "v": jax.tree_util.tree_map(jnp.zeros_like, params),
       "t": jnp.zeros((), jnp.int32)}
OPT_SHARD = {"m": SHARD, "v": SHARD, "t": REPL}

grad_fn = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(SHARD, BATCH, BATCH), out_shardings=(REPL, SHARD))
add = jax.jit(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b), in_shardings=(SHARD, SHARD), out_shardings=SHARD,
              donate_argnums=0)


def adam(p, o, g, lr=1e-3, b1=0.9, b2=0.999):
    t = o["t"] + 1
    m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g / args.micro, o["m"], g)
    v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * (g / args.micro) ** 2, o["v"], g)
    scale = lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    p = jax.tree_util.tree_map(lambda w, m, v: w - scale * m / (jnp.sqrt(v) + 1e-8), p, m, v)
    return p, {"m": m, "v": v, "t": t}


update = jax.jit(adam, in_shardings=(SHARD, OPT_SHARD, SHARD), out_shardings=(SHARD, OPT_SHARD), donate_argnums=(0, 1))
rng = np.random.default_rng(args.rank)

with jax_profile(args.out, steps=args.window, params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        with prof.step(i):  # dagprof (3/3)
            grads, loss = None, 0.0
            for _ in range(args.micro):
                x = jax.make_array_from_process_local_data(BATCH, rng.standard_normal((MB, 3, 16, 16)).astype(np.float32))
                y = jax.make_array_from_process_local_data(BATCH, rng.integers(0, CLASSES, MB).astype(np.int32))
                micro_loss, g = grad_fn(params, x, y)
                grads = g if grads is None else add(grads, g)
                loss = loss + micro_loss
            params, opt = update(params, opt, grads)
            jax.block_until_ready(params)
        if i % 3 == 0 and args.rank == 0:
            print(f"step {i}: loss {loss.item() / args.micro:.3f}", flush=True)
