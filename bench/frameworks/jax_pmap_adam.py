"""A user's JAX script: a residual MLP trained with ``jax.pmap`` over the processes' devices, ``lax.pmean`` called by hand
several times a step (the gradients, then the loss and the accuracy as metrics), Adam written by hand as optax would
(bias-corrected moments in a state pytree), the parameters and optimizer state donated (``donate_argnums``) and replicated
with a leading device axis, as pmap code is written.

Two processes on this host (gloo collectives): ``python jax_pmap_adam.py --out RUN --rank R --world N --port P``.
"""
import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from dagprof.collect.hooks.jax_profile import jax_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rank", type=int, required=True)
ap.add_argument("--world", type=int, default=2)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--coordinator", default="127.0.0.1", help="rank 0's host (its address)")
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--depth", type=int, default=4)
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
ndev = jax.local_device_count()
D, W = 96, 256

rng = np.random.default_rng(0)  # the same on every process: replicas start alike
params = {"inp": {"w": rng.normal(0, D ** -0.5, (D, W)), "b": np.zeros(W)},
          "res": [{"w1": rng.normal(0, W ** -0.5, (W, W)), "w2": np.zeros((W, W)), "scale": np.ones(W)} for _ in range(args.depth)],
          "out": {"w": rng.normal(0, W ** -0.5, (W, 5)), "b": np.zeros(5)}}
params = jax.tree_util.tree_map(lambda a: np.float32(a), params)


def forward(p, x):
    h = x @ p["inp"]["w"] + p["inp"]["b"]
    for r in p["res"]:
        h = h + jax.nn.relu(h * r["scale"] @ r["w1"]) @ r["w2"]
    return h @ p["out"]["w"] + p["out"]["b"]


def adam_init(p):
    zeros = jax.tree_util.tree_map(jnp.zeros_like, p)
    return {"count": jnp.zeros((), jnp.int32), "mu": zeros, "nu": zeros}


def adam_update(g, state, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    count = state["count"] + 1
    mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["mu"], g)
    nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state["nu"], g)
    c1, c2 = 1 - b1 ** count, 1 - b2 ** count
    updates = jax.tree_util.tree_map(lambda m, v: -lr * (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
    return updates, {"count": count, "mu": mu, "nu": nu}


@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0, 1))
def train_step(p, opt_state, x, y):
    def loss_fn(p):
        logits = forward(p, x)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1)), logits
    (loss, logits), g = jax.value_and_grad(loss_fn, has_aux=True)(p)
    g = jax.lax.pmean(g, "batch")
    updates, opt_state = adam_update(g, opt_state)
    p = jax.tree_util.tree_map(jnp.add, p, updates)
    loss = jax.lax.pmean(loss, "batch")
    acc = jax.lax.pmean(jnp.mean(jnp.argmax(logits, -1) == y), "batch")
    return p, opt_state, loss, acc


def replicate(tree):
    """A leading axis of one copy per local device, as pmap takes replicated state."""
    return jax.tree_util.tree_map(lambda a: np.stack([np.asarray(a)] * ndev), tree)


opt_state = replicate(adam_init(params))
params = replicate(params)
data = np.random.default_rng(1 + args.rank)
x = data.standard_normal((ndev, 64, D)).astype(np.float32)
y = data.integers(0, 5, (ndev, 64)).astype(np.int32)

with jax_profile(args.out, steps=(6, 14), params=jax.tree_util.tree_map(lambda a: a[0], params)) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        with prof.step(i):  # dagprof (3/3)
            params, opt_state, loss, acc = train_step(params, opt_state, x, y)
            jax.block_until_ready(params)
        if i % 5 == 4 and args.rank == 0:
            print(f"step {i}: loss {float(loss[0]):.3f} acc {float(acc[0]):.2f}", flush=True)
