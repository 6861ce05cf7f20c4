"""A user's JAX script: a variational autoencoder for tabular rows (32 mixed-scale features; an MLP encoder giving the
mean and log-variance of an 8-D latent, the reparameterisation trick, an MLP decoder with a learned per-feature
output scale), trained on the negative ELBO with a KL weight annealed over the steps, data parallel over the processes.

Habits it exercises that the other JAX scripts do not: the step's randomness from ``jax.random.fold_in(key, step)``
inside the jitted step (the step number a replicated int argument, each example's noise from the batch-sharded
array's own key split), ``jax.value_and_grad(..., has_aux=True)`` returning the reconstruction and KL terms beside the
loss, parameters as a dict of ``(w, b)`` tuples, Adam and gradient clipping by global norm written by hand as one
function (no optax in the venv), ``jax.jit`` with ``in_shardings`` / ``out_shardings`` of ``NamedSharding`` over a
``Mesh`` (batch sharded, parameters, optimizer state and step replicated, donated), the batch built with
``jax.make_array_from_process_local_data`` from each process's own numpy rows, and metrics fetched with
``jax.device_get`` of a dict every 4 steps. Two processes on this host (gloo collectives):
``python jax_vae_sharded.py --out RUN --rank R --world N --port P``.
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
ap.add_argument("--batch", type=int, default=256, help="per process")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("data",))
FEAT, HIDDEN, LATENT = 32, 256, 8


def dense(key, a, b):
    return (jax.random.normal(key, (a, b)) * np.sqrt(2.0 / a), jnp.zeros(b))


def init(key):
    ks = jax.random.split(key, 6)
    return {"enc1": dense(ks[0], FEAT, HIDDEN), "enc2": dense(ks[1], HIDDEN, HIDDEN), "mu": dense(ks[2], HIDDEN, LATENT),
            "logvar": dense(ks[3], HIDDEN, LATENT), "dec1": dense(ks[4], LATENT, HIDDEN), "dec2": dense(ks[5], HIDDEN, FEAT),
            "log_scale": jnp.zeros(FEAT)}


def lin(p, x):
    return x @ p[0] + p[1]


def neg_elbo(params, x, key, beta):
    h = jax.nn.silu(lin(params["enc2"], jax.nn.silu(lin(params["enc1"], x))))
    mu, logvar = lin(params["mu"], h), lin(params["logvar"], h)
    z = mu + jnp.exp(0.5 * logvar) * jax.random.normal(key, mu.shape)
    recon = lin(params["dec2"], jax.nn.silu(lin(params["dec1"], z)))
    scale = jnp.exp(params["log_scale"])
    nll = (0.5 * ((x - recon) / scale) ** 2 + params["log_scale"]).sum(1).mean()
    kl = (-0.5 * (1 + logvar - mu ** 2 - jnp.exp(logvar))).sum(1).mean()
    return nll + beta * kl, {"nll": nll, "kl": kl}


def adam_clipped(params, grads, state, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, max_norm=1.0):
    """Clip the whole gradient to ``max_norm`` by its global norm, then one Adam step."""
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    grads = jax.tree.map(lambda g: g * jnp.minimum(1.0, max_norm / (norm + 1e-6)), grads)
    t, m, v = state
    t = t + 1
    m = jax.tree.map(lambda a, g: b1 * a + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda a, g: b2 * a + (1 - b2) * g * g, v, grads)
    params = jax.tree.map(lambda p, a, b: p - lr * (a / (1 - b1 ** t)) / (jnp.sqrt(b / (1 - b2 ** t)) + eps), params, m, v)
    return params, (t, m, v), norm


def train_step(params, state, x, step):
    key = jax.random.fold_in(jax.random.key(7), step)
    beta = jnp.minimum(1.0, step / 12.0)  # KL annealing
    (loss, aux), grads = jax.value_and_grad(neg_elbo, has_aux=True)(params, x, key, beta)
    params, state, norm = adam_clipped(params, grads, state)
    return params, state, dict(aux, loss=loss, grad_norm=norm)


def rows(rng, n):
    """Correlated features of mixed scales: a low-rank signal plus noise."""
    basis = np.random.default_rng(3).standard_normal((4, FEAT)) * np.linspace(0.2, 5, FEAT)
    return (rng.standard_normal((n, 4)) @ basis + 0.1 * rng.standard_normal((n, FEAT))).astype(np.float32)


repl, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
params = jax.device_put(init(jax.random.key(0)), repl)
state = jax.device_put((jnp.zeros((), jnp.int32), jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params)), repl)
step_fn = jax.jit(train_step, in_shardings=(repl, repl, data, repl), out_shardings=(repl, repl, repl), donate_argnums=(0, 1))
rng = np.random.default_rng(20 + args.rank)
with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        x = jax.make_array_from_process_local_data(data, rows(rng, args.batch))
        with prof.step(i):  # dagprof (3/3)
            params, state, metrics = step_fn(params, state, x, jnp.asarray(i, jnp.int32))
            jax.block_until_ready(params)
        if i % 4 == 3 and args.rank == 0:
            m = jax.device_get(metrics)
            print(f"step {i}: -elbo {m['loss']:.2f} nll {m['nll']:.2f} kl {m['kl']:.2f} |g| {m['grad_norm']:.2f}", flush=True)
