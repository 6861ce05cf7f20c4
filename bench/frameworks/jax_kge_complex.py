"""A user's JAX script: ComplEx knowledge-graph embeddings (Trouillon et al. 2016) on a synthetic graph of 3,000 entities
and 24 relations, each positive triple scored against 16 tails drawn at random on the device, a softplus loss with N3
regularisation; data parallel over the processes.

Habits it exercises that the other JAX scripts do not: parameters as a frozen dataclass registered with
``jax.tree_util.register_dataclass`` (entity and relation tables, real and imaginary halves), the gathers by
``jnp.take`` of the tables (their gradients scatter-add into dense tables, all-reduced whole), negatives drawn inside
the jitted step with ``jax.random.randint`` from a key carried in the state and split each step,
``jax.lax.with_sharding_constraint`` on the scores, hand-written Adagrad (the optimizer KGE papers use; no optax in
the venv), ``jax.jit(..., donate_argnames=...)``, and a mean-reciprocal-rank check every 8 steps whose per-process
figures (each on its own copy of the tables, ``addressable_data(0)``) meet by ``multihost_utils.process_allgather``
(a collective outside the step) on every process.
Two processes on this host (gloo collectives): ``python jax_kge_complex.py --out RUN --rank R --world N --port P``.
"""
import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dagprof.collect.hooks.jax_profile import jax_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rank", type=int, required=True)
ap.add_argument("--world", type=int, default=2)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--coordinator", default="127.0.0.1", help="rank 0's host (its address)")
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=256, help="positive triples per process")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("data",))
ENTITIES, RELATIONS, DIM, NEGATIVES = 3000, 24, 64, 16


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Tables:
    ent_re: jax.Array
    ent_im: jax.Array
    rel_re: jax.Array
    rel_im: jax.Array


def init(key):
    ks = jax.random.split(key, 4)
    return Tables(*(0.1 * jax.random.normal(k, (n, DIM)) for k, n in zip(ks, (ENTITIES, ENTITIES, RELATIONS, RELATIONS))))


def score(t, h, r, tails):
    """Re(<e_h, w_r, conj(e_t)>) for each head/relation against its row of ``tails`` (batch, k)."""
    hr, hi = jnp.take(t.ent_re, h, axis=0), jnp.take(t.ent_im, h, axis=0)
    rr, ri = jnp.take(t.rel_re, r, axis=0), jnp.take(t.rel_im, r, axis=0)
    a, b = hr * rr - hi * ri, hr * ri + hi * rr
    tr, ti = jnp.take(t.ent_re, tails, axis=0), jnp.take(t.ent_im, tails, axis=0)
    return jnp.einsum("bd,bkd->bk", a, tr) + jnp.einsum("bd,bkd->bk", b, ti)


def loss_fn(t, triples, key):
    h, r, tail = triples[:, 0], triples[:, 1], triples[:, 2]
    negatives = jax.random.randint(key, (triples.shape[0], NEGATIVES), 0, ENTITIES)
    s = score(t, h, r, jnp.concatenate([tail[:, None], negatives], 1))
    s = jax.lax.with_sharding_constraint(s, NamedSharding(mesh, P("data")))
    fit = jax.nn.softplus(-s[:, 0]).mean() + jax.nn.softplus(s[:, 1:]).mean()
    n3 = sum(jnp.sum(jnp.abs(jnp.take(x, i, axis=0)) ** 3) for x, i in
             ((t.ent_re, h), (t.ent_im, h), (t.ent_re, tail), (t.ent_im, tail))) / triples.shape[0]
    return fit + 1e-3 * n3


def train_step(t, acc, key, triples, lr=0.1):
    key, sub = jax.random.split(key)
    loss, g = jax.value_and_grad(loss_fn)(t, triples, sub)
    acc = jax.tree.map(lambda a, x: a + x * x, acc, g)  # Adagrad
    t = jax.tree.map(lambda p, x, a: p - lr * x / (jnp.sqrt(a) + 1e-10), t, g, acc)
    return t, acc, key, loss


def graph(seed, n):
    """Triples from relation-specific permutations of a few entity clusters, so ranking them is learnable."""
    rng = np.random.default_rng(seed)
    perms = np.random.default_rng(0).permutation(ENTITIES * RELATIONS).reshape(RELATIONS, ENTITIES) % ENTITIES
    h, r = rng.integers(0, ENTITIES, n), rng.integers(0, RELATIONS, n)
    return np.stack([h, r, perms[r, h]], 1).astype(np.int32)


@jax.jit
def mrr(t, triples):
    all_tails = jnp.broadcast_to(jnp.arange(ENTITIES), (triples.shape[0], ENTITIES))
    s = score(t, triples[:, 0], triples[:, 1], all_tails)
    rank = (s > jnp.take_along_axis(s, triples[:, 2:3], 1)).sum(1) + 1
    return (1.0 / rank).mean()


repl, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
tables = jax.device_put(init(jax.random.key(0)), repl)
acc = jax.device_put(jax.tree.map(lambda x: jnp.full_like(x, 0.1), tables), repl)
key = jax.jit(lambda: jax.random.key(1), out_shardings=repl)()  # a typed key cannot be device_put across processes
step_fn = jax.jit(train_step, donate_argnames=("t", "acc"))
rng_seed, held = 100 + args.rank, graph(999 + args.rank, 64)
with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=tables) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        triples = jax.make_array_from_process_local_data(data, graph(rng_seed + i, args.batch))
        with prof.step(i):  # dagprof (3/3)
            tables, acc, key, loss = step_fn(tables, acc, key, triples)
            jax.block_until_ready(tables)
        if i % 8 == 7:
            local = jax.tree.map(lambda x: x.addressable_data(0), tables)  # this process's copy of the replicated tables
            per_process = multihost_utils.process_allgather(mrr(local, jnp.asarray(held)))
            if args.rank == 0:
                print(f"step {i}: loss {float(loss):.3f} MRR {np.mean(per_process):.3f}", flush=True)
