"""A user's JAX script: a graph attention network (GAT, Velickovic et al. 2018, small: three multi-head attention
layers over edge lists, mean pooling per graph, an MLP head) classifying synthetic random graphs (does a node of type 0
neighbour more than four of type 1?), data parallel under ``shard_map`` with an exponential moving average of the
weights kept for evaluation.

Habits it exercises that the other JAX scripts do not: graphs batched as flat node and edge arrays (jraph's habit: a
batch of graphs is one disconnected graph, padded to fixed node and edge counts per process, a padding graph taking the
rest, each process's sender/receiver indices local to its shard), message passing by ``jax.ops.segment_sum`` and the
edge softmax by ``jax.ops.segment_max`` per receiver, pooling by ``segment_sum`` over graph ids, one ``lax.pmean`` over
the whole gradient pytree and one over the metrics, the loss masked for the padding graph, ``optax.adamw`` after
``optax.clip_by_global_norm``, and an EMA of the parameters updated every step with ``optax.incremental_update``
(carried through the step beside the optimizer state). Two processes on this host (gloo collectives):
``python jax_gat_segment_ema.py --out RUN --rank R --world N --port P``.
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dagprof.collect.hooks.jax_profile import jax_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rank", type=int, required=True)
ap.add_argument("--world", type=int, default=2)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--coordinator", default="127.0.0.1", help="rank 0's host (its address)")
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--graphs", type=int, default=48, help="graphs per process and step")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("data",))
TYPES, HIDDEN, HEADS, LAYERS, MAX_NODES = 6, 64, 4, 3, 24
NODES, EDGES, GRAPHS = args.graphs * MAX_NODES + 1, args.graphs * MAX_NODES * 6, args.graphs + 1  # + the padding graph


def batch(rng):
    """One process's graphs as flat arrays, padded: node types, senders, receivers, each node's graph, labels, graph mask."""
    types, send, recv, gid, labels = [], [], [], [], []
    base = 0
    for g in range(args.graphs):
        n = int(rng.integers(8, MAX_NODES + 1))
        t = rng.integers(0, TYPES, n)
        s, r = np.nonzero(np.triu(rng.random((n, n)) < 2.5 / n, 1))
        s, r = np.concatenate([s, r]), np.concatenate([r, s])  # both directions
        labels.append(int(max(((t[s] == 0) & (t[r] == 1)).sum() - 4, 0) > 0) if len(s) else 0)
        types.append(t)
        send.append(s + base)
        recv.append(r + base)
        gid.append(np.full(n, g))
        base += n
    types, send, recv, gid = (np.concatenate(a) for a in (types, send, recv, gid))
    pad_n, pad_e = NODES - base, EDGES - len(send)  # padding nodes and self-edges of the padding node, graph GRAPHS-1
    types = np.concatenate([types, np.zeros(pad_n, int)])
    send, recv = (np.concatenate([a, np.full(pad_e, NODES - 1)])[:EDGES] for a in (send, recv))
    gid = np.concatenate([gid, np.full(pad_n, GRAPHS - 1)])
    mask = np.concatenate([np.ones(args.graphs), [0.0]])
    return (types.astype(np.int32), send.astype(np.int32), recv.astype(np.int32), gid.astype(np.int32),
            np.asarray(labels + [0], np.int32), mask.astype(np.float32))


def glorot(key, shape):
    return jax.random.normal(key, shape) * np.sqrt(2.0 / (shape[0] + shape[-1]))


def init(key):
    k = jax.random.split(key, 3 * LAYERS + 3)
    layers = [{"w": glorot(k[3 * i], (HIDDEN, HEADS, HIDDEN // HEADS)), "a_src": glorot(k[3 * i + 1], (HEADS, HIDDEN // HEADS)),
               "a_dst": glorot(k[3 * i + 2], (HEADS, HIDDEN // HEADS)), "b": jnp.zeros(HIDDEN)} for i in range(LAYERS)]
    return {"embed": jax.random.normal(k[-3], (TYPES, HIDDEN)) * 0.3, "layers": layers,
            "mlp": {"w1": glorot(k[-2], (HIDDEN, HIDDEN)), "b1": jnp.zeros(HIDDEN), "w2": glorot(k[-1], (HIDDEN, 2)), "b2": jnp.zeros(2)}}


def gat_layer(p, x, send, recv):
    h = jnp.einsum("nd,dhk->nhk", x, p["w"])
    logits = jax.nn.leaky_relu((h * p["a_src"]).sum(-1)[send] + (h * p["a_dst"]).sum(-1)[recv], 0.2)  # (E, heads)
    logits = logits - jax.ops.segment_max(logits, recv, num_segments=NODES)[recv]
    w = jnp.exp(logits)
    alpha = w / (jax.ops.segment_sum(w, recv, num_segments=NODES)[recv] + 1e-9)
    out = jax.ops.segment_sum(alpha[..., None] * h[send], recv, num_segments=NODES)
    return jax.nn.elu(out.reshape(NODES, HIDDEN) + p["b"]) + x


def loss_fn(params, types, send, recv, gid, labels, mask):
    x = params["embed"][types]
    for p in params["layers"]:
        x = gat_layer(p, x, send, recv)
    counts = jax.ops.segment_sum(jnp.ones(NODES), gid, num_segments=GRAPHS)
    pooled = jax.ops.segment_sum(x, gid, num_segments=GRAPHS) / jnp.maximum(counts, 1)[:, None]
    m = params["mlp"]
    logits = jax.nn.relu(pooled @ m["w1"] + m["b1"]) @ m["w2"] + m["b2"]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return (ce * mask).sum() / mask.sum(), ((logits.argmax(-1) == labels) * mask).sum() / mask.sum()


tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(2e-3, weight_decay=1e-4))


def step(params, opt_state, ema, types, send, recv, gid, labels, mask):
    (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, types, send, recv, gid, labels, mask)
    grads = jax.lax.pmean(grads, "data")
    loss, acc = jax.lax.pmean((loss, acc), "data")
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, optax.incremental_update(params, ema, step_size=0.01), loss, acc


DATA = P("data")
train = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P(), P(), DATA, DATA, DATA, DATA, DATA, DATA),
                              out_specs=(P(), P(), P(), P(), P()), check_vma=False))
params = init(jax.random.key(0))
repl = NamedSharding(mesh, P())
params, opt_state = jax.device_put(params, repl), jax.device_put(tx.init(params), repl)
ema = jax.tree_util.tree_map(jnp.copy, params)
sharded = NamedSharding(mesh, DATA)
rng = np.random.default_rng(50 + args.rank)

with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        arrays = [jax.make_array_from_process_local_data(sharded, a) for a in batch(rng)]
        with prof.step(i):  # dagprof (3/3)
            params, opt_state, ema, loss, acc = train(params, opt_state, ema, *arrays)
            jax.block_until_ready(params)
        if i % 6 == 5 and args.rank == 0:
            print(f"step {i}: loss {float(loss):.3f} acc {float(acc):.3f}", flush=True)
