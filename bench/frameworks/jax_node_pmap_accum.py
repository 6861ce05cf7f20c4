"""A user's JAX script: a neural ODE classifier on synthetic 2-D spirals (the input lifted to 32 dimensions, a
time-conditioned MLP as the vector field integrated by a fixed-step RK4 solver over t in [0, 1], a linear read-out),
data parallel by ``jax.pmap`` over the processes' devices.

Habits it exercises that the other JAX scripts do not: the solver written as ``lax.scan`` over the RK4 steps (the
vector field called 4 times a step, backpropagated through the unrolled solve), gradient accumulation as
``optax.MultiSteps`` does it, written by hand (the venv has no optax): every step's gradients ``lax.pmean``-ed and
added to an accumulator in the optimizer state, the update applied every ``--accum`` steps inside ``lax.cond`` (so one
compiled step, its collectives every call), SGD with Nesterov momentum and a weight decay mask that spares the biases,
the step counter and the metrics (loss, accuracy, the accumulator's global norm) ``pmean``-ed, and the state donated
(``donate_argnums``). Two processes on this host (gloo collectives): ``python jax_node_pmap_accum.py --out RUN --rank R
--world N --port P``.
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
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=128, help="per process")
ap.add_argument("--accum", type=int, default=2)
ap.add_argument("--rk-steps", type=int, default=6)
ap.add_argument("--window", default="6:14")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=args.world, process_id=args.rank)
ndev = jax.local_device_count()
D, H, CLASSES = 32, 128, 3


def init(key):
    k = jax.random.split(key, 4)
    dense = lambda kk, i, o: {"w": jax.random.normal(kk, (i, o)) * i ** -0.5, "b": jnp.zeros(o)}  # noqa: E731
    return {"lift": dense(k[0], 2, D), "f1": dense(k[1], D + 1, H), "f2": dense(k[2], H + 1, D), "read": dense(k[3], D, CLASSES)}


def field(p, t, z):
    """dz/dt: an MLP that also sees t."""
    tt = jnp.full((z.shape[0], 1), t)
    h = jnp.tanh(jnp.concatenate([z, tt], 1) @ p["f1"]["w"] + p["f1"]["b"])
    return jnp.concatenate([h, tt], 1) @ p["f2"]["w"] + p["f2"]["b"]


def odeint_rk4(p, z, n):
    dt = 1.0 / n

    def rk4(z, t):
        k1 = field(p, t, z)
        k2 = field(p, t + dt / 2, z + dt / 2 * k1)
        k3 = field(p, t + dt / 2, z + dt / 2 * k2)
        k4 = field(p, t + dt, z + dt * k3)
        return z + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4), None

    z, _ = jax.lax.scan(rk4, z, jnp.arange(n) * dt)
    return z


def loss_fn(p, x, y):
    z = odeint_rk4(p, x @ p["lift"]["w"] + p["lift"]["b"], args.rk_steps)
    logits = z @ p["read"]["w"] + p["read"]["b"]
    loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))
    return loss, jnp.mean(jnp.argmax(logits, -1) == y)


DECAY = jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key == "w", init(jax.random.PRNGKey(0)))


@functools.partial(jax.pmap, axis_name="devices", donate_argnums=(0, 1))
def train_step(p, state, x, y):
    (loss, acc), g = jax.value_and_grad(loss_fn, has_aux=True)(p, x, y)
    g = jax.lax.pmean(g, "devices")
    acc_g = jax.tree_util.tree_map(jnp.add, state["acc"], g)
    mini = state["mini"] + 1

    def apply(_):
        mean = jax.tree_util.tree_map(lambda a: a / args.accum, acc_g)
        mean = jax.tree_util.tree_map(lambda a, w, d: a + 5e-4 * w * d, mean, p, DECAY)
        mom = jax.tree_util.tree_map(lambda m, a: 0.9 * m + a, state["mom"], mean)
        new_p = jax.tree_util.tree_map(lambda w, m, a: w - 0.05 * (a + 0.9 * m), p, mom, mean)
        return new_p, mom, jax.tree_util.tree_map(jnp.zeros_like, acc_g)

    def keep(_):
        return p, state["mom"], acc_g

    new_p, mom, acc_g = jax.lax.cond(mini % args.accum == 0, apply, keep, None)
    norm = jnp.sqrt(sum(jnp.sum(a * a) for a in jax.tree_util.tree_leaves(acc_g)))
    metrics = jax.lax.pmean({"loss": loss, "acc": acc, "acc_norm": norm}, "devices")
    return new_p, {"mom": mom, "acc": acc_g, "mini": mini}, metrics


def replicate(tree):
    return jax.tree_util.tree_map(lambda a: np.stack([np.asarray(a)] * ndev), tree)


def spirals(rng, n):
    y = rng.integers(0, CLASSES, n)
    r = rng.uniform(0.1, 1.0, n)
    theta = 3.0 * r + 2 * np.pi * y / CLASSES
    x = np.stack([r * np.cos(theta), r * np.sin(theta)], 1) + 0.03 * rng.standard_normal((n, 2))
    return x.astype(np.float32), y.astype(np.int32)


params = init(jax.random.PRNGKey(0))  # the same key on every process: replicas start alike
zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
state = replicate({"mom": zeros, "acc": zeros, "mini": jnp.zeros((), jnp.int32)})
params = replicate(params)
rng = np.random.default_rng(10 + args.rank)
batches = [spirals(rng, ndev * args.batch) for _ in range(4)]
batches = [(x.reshape(ndev, args.batch, 2), y.reshape(ndev, args.batch)) for x, y in batches]

a, b = (int(v) for v in args.window.split(":"))
with jax_profile(args.out, steps=(a, b), params=jax.tree_util.tree_map(lambda v: v[0], params)) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        x, y = batches[i % len(batches)]
        with prof.step(i):  # dagprof (3/3)
            params, state, metrics = train_step(params, state, x, y)
            jax.block_until_ready(params)
        if i % 6 == 5 and args.rank == 0:
            m = jax.device_get(metrics)
            print(f"step {i}: loss {m['loss'][0]:.3f} acc {m['acc'][0]:.2f} |acc g| {m['acc_norm'][0]:.3f}", flush=True)
