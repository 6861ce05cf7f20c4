"""A user's JAX script: a RealNVP normalising flow (8 affine coupling layers, each an MLP giving the scale and shift of
one half of the vector from the other half, the halves swapped between layers) fitted by maximum likelihood to a
synthetic 16-D density (a correlated Gaussian mixture), data parallel over the processes.

Habits it exercises that the other JAX scripts do not: the coupling layers' weights stacked on a leading axis and run
by ``jax.lax.fori_loop`` (the layer picked with ``jax.tree.map(lambda w: w[i], ...)``, the log-determinant in the carry,
differentiated through), a flax-free pure pytree of parameters, an optax-style chain of gradient transformations
(``clip_by_global_norm``, ``scale_by_adam``, ``add_decayed_weights``, ``scale_by_schedule`` of an exponential decay,
``scale(-1)``: each an ``(init, update)`` pair, composed by ``chain``; written by hand as optax spells them, as the
venv has no optax), ``jax.jit`` with explicit ``in_shardings`` / ``out_shardings`` of
``NamedSharding`` over a ``Mesh`` built from ``jax.devices()`` (the batch sharded, the parameters and optimizer
state replicated, donated), the batch drawn by the host with numpy and handed over with
``jax.make_array_from_process_local_data``, and the negative log-likelihood in bits per dimension logged every 5 steps.
Two processes on this host (gloo collectives): ``python jax_flow_fori.py --out RUN --rank R --world N --port P``.
"""
import argparse
from typing import Callable, NamedTuple

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
ap.add_argument("--batch", type=int, default=256, help="per process")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("batch",))
DIM, HALF, HIDDEN, LAYERS = 16, 8, 128, 8


def init(key):
    """Every coupling layer's MLP, stacked on a leading layer axis; the last layer starts at zero (an identity flow)."""
    k1, k2 = jax.random.split(key)
    he = lambda k, a, b: jax.random.normal(k, (LAYERS, a, b)) * np.sqrt(2.0 / a)  # noqa: E731
    return {"w1": he(k1, HALF, HIDDEN), "b1": jnp.zeros((LAYERS, HIDDEN)),
            "w2": he(k2, HIDDEN, HIDDEN), "b2": jnp.zeros((LAYERS, HIDDEN)),
            "ws": jnp.zeros((LAYERS, HIDDEN, HALF)), "bs": jnp.zeros((LAYERS, HALF)),
            "wt": jnp.zeros((LAYERS, HIDDEN, HALF)), "bt": jnp.zeros((LAYERS, HALF))}


def to_latent(params, x):
    """x -> z through the coupling layers, and the log-determinant of the Jacobian, per sample."""
    def layer(i, carry):
        x, logdet = carry
        p = jax.tree.map(lambda w: w[i], params)
        a, b = x[:, :HALF], x[:, HALF:]
        h = jax.nn.gelu(jax.nn.gelu(a @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])
        s = jnp.tanh(h @ p["ws"] + p["bs"])
        b = b * jnp.exp(s) + h @ p["wt"] + p["bt"]
        return jnp.concatenate([b, a], axis=1), logdet + s.sum(1)  # the halves swapped for the next layer
    return jax.lax.fori_loop(0, LAYERS, layer, (x, jnp.zeros(x.shape[0])))


def nll(params, x):
    z, logdet = to_latent(params, x)
    logp = -0.5 * (z ** 2).sum(1) - 0.5 * DIM * np.log(2 * np.pi) + logdet
    return -logp.mean()


class Transform(NamedTuple):
    """optax's ``GradientTransformation``: ``init(params) -> state``, ``update(grads, state, params) -> (updates, state)``."""
    init: Callable
    update: Callable


def chain(*ts):
    def update(g, state, params):
        new = []
        for t, s in zip(ts, state):
            g, s = t.update(g, s, params)
            new.append(s)
        return g, tuple(new)
    return Transform(lambda p: tuple(t.init(p) for t in ts), update)


def clip_by_global_norm(limit):
    def update(g, state, params):
        norm = jnp.sqrt(sum(jnp.vdot(x, x) for x in jax.tree.leaves(g)))
        return jax.tree.map(lambda x: x * jnp.minimum(1.0, limit / (norm + 1e-9)), g), state
    return Transform(lambda p: (), update)


def scale_by_adam(b1=0.9, b2=0.999, eps=1e-8):
    def update(g, state, params):
        count, mu, nu = state
        count = count + 1
        mu = jax.tree.map(lambda m, x: b1 * m + (1 - b1) * x, mu, g)
        nu = jax.tree.map(lambda v, x: b2 * v + (1 - b2) * x * x, nu, g)
        return jax.tree.map(lambda m, v: (m / (1 - b1 ** count)) / (jnp.sqrt(v / (1 - b2 ** count)) + eps), mu, nu), (count, mu, nu)
    return Transform(lambda p: (jnp.zeros((), jnp.int32), jax.tree.map(jnp.zeros_like, p), jax.tree.map(jnp.zeros_like, p)), update)


def add_decayed_weights(wd):
    return Transform(lambda p: (), lambda g, s, p: (jax.tree.map(lambda x, w: x + wd * w, g, p), s))


def scale_by_schedule(fn):
    def update(g, count, params):
        return jax.tree.map(lambda x: fn(count) * x, g), count + 1
    return Transform(lambda p: jnp.zeros((), jnp.int32), update)


def scale(k):
    return Transform(lambda p: (), lambda g, s, p: (jax.tree.map(lambda x: k * x, g), s))


def apply_updates(params, updates):
    return jax.tree.map(jnp.add, params, updates)


schedule = lambda count: 2e-3 * 0.9 ** (count / 10)  # noqa: E731  (optax.exponential_decay(2e-3, 10, 0.9))
tx = chain(clip_by_global_norm(5.0), scale_by_adam(), add_decayed_weights(1e-5), scale_by_schedule(schedule), scale(-1.0))


def train_step(params, opt_state, x):
    loss, grads = jax.value_and_grad(nll)(params, x)
    updates, opt_state = tx.update(grads, opt_state, params)
    return apply_updates(params, updates), opt_state, loss


def sample(rng, n):
    """A mixture of 4 correlated Gaussians in 16-D."""
    centres = np.linspace(-3, 3, 4)[:, None] * np.ones((1, DIM))
    mix = np.tril(np.full((DIM, DIM), 0.15)) + 0.5 * np.eye(DIM)
    return (centres[rng.integers(0, 4, n)] + rng.standard_normal((n, DIM)) @ mix.T).astype(np.float32)


repl, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("batch"))
params = jax.device_put(init(jax.random.key(0)), repl)
opt_state = jax.device_put(tx.init(params), repl)
step = jax.jit(train_step, in_shardings=(repl, repl, data), out_shardings=(repl, repl, repl), donate_argnums=(0, 1))
rng = np.random.default_rng(50 + args.rank)
with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        x = jax.make_array_from_process_local_data(data, sample(rng, args.batch))
        with prof.step(i):  # dagprof (3/3)
            params, opt_state, loss = step(params, opt_state, x)
            jax.block_until_ready(params)
        if i % 5 == 0 and args.rank == 0:
            print(f"step {i}: nll {float(loss) / DIM / np.log(2):.3f} bits/dim", flush=True)
