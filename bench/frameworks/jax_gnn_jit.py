"""A user's JAX script: a graph network (three graph-convolution layers, attention pooling over the nodes, an MLP head)
on batches of small random graphs, data parallel by ``jax.jit`` with explicit ``in_shardings`` / ``out_shardings``
on a ``Mesh``: the graphs are split over the processes, the parameters replicated with ``jax.device_put``, and XLA
inserts the gradient all-reduces (no ``shard_map``, no ``pmean``). RMSprop with momentum and decoupled weight decay,
written by hand over a nested parameter tree (a list of layer dicts), its state donated. The loss is fetched every
step, as a user printing it would (``float(loss)`` ends the step).

Two processes on this host (gloo collectives): ``python jax_gnn_jit.py --out RUN --rank R --world N --port P``.
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
mesh = Mesh(jax.devices(), axis_names=("graphs",))
REPL, SPLIT = NamedSharding(mesh, P()), NamedSharding(mesh, P("graphs"))
NODES, FEAT, HID, CLASSES, LOCAL = 24, 32, 96, 6, 48

key = jax.random.key(0)  # the same on every process: the replicated parameters agree
keys = jax.random.split(key, 8)
params = {
    "gcn": [{"w": jax.random.normal(keys[i], (FEAT if i == 0 else HID, HID)) * 0.1, "b": jnp.zeros(HID)} for i in range(3)],
    "pool_query": jax.random.normal(keys[3], (HID,)) * 0.1,
    "mlp": {"w1": jax.random.normal(keys[4], (HID, 128)) * 0.1, "b1": jnp.zeros(128),
            "w2": jax.random.normal(keys[5], (128, CLASSES)) * 0.1, "b2": jnp.zeros(CLASSES)},
}
params = jax.device_put(params, REPL)
state = jax.device_put({"sq": jax.tree.map(jnp.zeros_like, params), "mom": jax.tree.map(jnp.zeros_like, params)}, REPL)


def forward(p, adj, x):
    deg = adj.sum(-1, keepdims=True) + 1.0
    a = (adj + jnp.eye(NODES)) / deg  # mean over self and neighbours
    h = x
    for layer in p["gcn"]:
        h = jax.nn.relu(a @ h @ layer["w"] + layer["b"])
    weights = jax.nn.softmax(h @ p["pool_query"], axis=-1)  # (graphs, nodes)
    g = jnp.einsum("bn,bnh->bh", weights, h)
    return jax.nn.relu(g @ p["mlp"]["w1"] + p["mlp"]["b1"]) @ p["mlp"]["w2"] + p["mlp"]["b2"]


def loss_fn(p, adj, x, y):
    logp = jax.nn.log_softmax(forward(p, adj, x))
    return -jnp.mean(logp[jnp.arange(y.shape[0]), y])


def update(p, s, adj, x, y, lr=1e-3, rho=0.9, mu=0.9, wd=1e-4):
    loss, g = jax.value_and_grad(loss_fn)(p, adj, x, y)
    sq = jax.tree.map(lambda s, g: rho * s + (1 - rho) * g * g, s["sq"], g)
    mom = jax.tree.map(lambda m, g, s: mu * m + lr * g / jnp.sqrt(s + 1e-7), s["mom"], g, sq)
    p = jax.tree.map(lambda w, m: w * (1 - lr * wd) - m, p, mom)
    return p, {"sq": sq, "mom": mom}, loss


train = jax.jit(update, in_shardings=(REPL, REPL, SPLIT, SPLIT, SPLIT), out_shardings=(REPL, REPL, REPL), donate_argnums=(0, 1))

rng = np.random.default_rng(3 + args.rank)  # each process its own graphs
adj_local = (rng.random((LOCAL, NODES, NODES)) < 0.15).astype(np.float32)
adj_local = np.maximum(adj_local, adj_local.transpose(0, 2, 1))
adj = jax.make_array_from_process_local_data(SPLIT, adj_local)
x = jax.make_array_from_process_local_data(SPLIT, rng.standard_normal((LOCAL, NODES, FEAT)).astype(np.float32))
y = jax.make_array_from_process_local_data(SPLIT, rng.integers(0, CLASSES, LOCAL).astype(np.int32))

with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        with prof.step(i):  # dagprof (3/3)
            params, state, loss = train(params, state, adj, x, y)
            loss = float(loss)
    if args.rank == 0:
        print(f"final loss {loss:.4f}", flush=True)
