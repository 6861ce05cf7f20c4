"""A user's JAX script: a Linear Recurrent Unit network (Orvieto et al. 2023, small: a token embedding, two residual
blocks of LayerNorm, a diagonal complex linear recurrence evaluated by ``jax.lax.associative_scan`` over the sequence,
a GLU, mean pooling and a linear head) deciding for sequences of 64 tokens whether token 3 outnumbers token 7, data
parallel over the processes by ``jax.jit`` on a batch-sharded global array.

Habits it exercises that the other JAX scripts do not: the recurrence as a parallel prefix scan of complex numbers
(``lax.associative_scan`` with the (a, b) -> (a_j a_i, a_j b_i + b_j) operator) from real parameters (the
exponential parameterisation of the eigenvalues, ``nu_log``/``theta_log``, and a ``gamma_log`` normalisation), the
paper's ring initialisation, optax's ``multi_transform`` giving the recurrent parameters their own Adam (smaller
rate, no weight decay) and the rest AdamW, chained after ``clip_by_global_norm`` with a
``warmup_cosine_decay_schedule``, labels built by ``jax.tree_util.tree_map_with_path`` from the parameter paths, the
optimizer state placed with ``jax.device_put`` on the replicated sharding, ``lax.with_sharding_constraint`` on the
activations, and the batch made by ``jax.make_array_from_process_local_data``. Two processes on this host (gloo
collectives): ``python jax_lru_multiopt.py --out RUN --rank R --world N --port P``.
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
ap.add_argument("--batch", type=int, default=16, help="sequences per process")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("data",))
VOCAB, LENGTH, H, N, BLOCKS = 16, 64, 64, 32, 2


def lru_init(key, r_min=0.4, r_max=0.99, max_phase=2 * np.pi):
    """Eigenvalues uniform on a ring (radius r_min..r_max), B and C Glorot-like, gamma normalising the state's scale."""
    k = jax.random.split(key, 6)
    u1, u2 = jax.random.uniform(k[0], (N,)), jax.random.uniform(k[1], (N,))
    nu_log = jnp.log(-0.5 * jnp.log(u1 * (r_max ** 2 - r_min ** 2) + r_min ** 2))
    theta_log = jnp.log(max_phase * u2)
    gamma_log = jnp.log(jnp.sqrt(1 - jnp.abs(jnp.exp(-jnp.exp(nu_log) + 1j * jnp.exp(theta_log))) ** 2))
    return {"nu_log": nu_log, "theta_log": theta_log, "gamma_log": gamma_log,
            "B_re": jax.random.normal(k[2], (N, H)) / np.sqrt(2 * H), "B_im": jax.random.normal(k[3], (N, H)) / np.sqrt(2 * H),
            "C_re": jax.random.normal(k[4], (H, N)) / np.sqrt(N), "C_im": jax.random.normal(k[5], (H, N)) / np.sqrt(N),
            "D": jnp.ones(H)}


def init(key):
    k = jax.random.split(key, 2 + 2 * BLOCKS)
    blocks = [{"lru": lru_init(k[2 + 2 * i]), "ln": jnp.ones(H),
               "glu": {"w": jax.random.normal(k[3 + 2 * i], (H, 2 * H)) / np.sqrt(H), "b": jnp.zeros(2 * H)}} for i in range(BLOCKS)]
    return {"embed": jax.random.normal(k[0], (VOCAB, H)) * 0.1, "blocks": blocks,
            "head": {"w": jax.random.normal(k[1], (H, 2)) / np.sqrt(H), "b": jnp.zeros(2)}}


def binary(e_i, e_j):
    a_i, b_i = e_i
    a_j, b_j = e_j
    return a_j * a_i, a_j * b_i + b_j


def lru(p, u):
    """u: (batch, length, H) -> (batch, length, H); the state h_t = Lambda h_{t-1} + B u_t by a prefix scan."""
    lam = jnp.exp(-jnp.exp(p["nu_log"]) + 1j * jnp.exp(p["theta_log"]))
    b = (p["B_re"] + 1j * p["B_im"]) * jnp.exp(p["gamma_log"])[:, None]
    bu = jnp.einsum("blh,nh->bln", u.astype(jnp.complex64), b)
    _, h = jax.lax.associative_scan(binary, (jnp.broadcast_to(lam, bu.shape), bu), axis=1)
    return jnp.einsum("bln,hn->blh", h, p["C_re"] + 1j * p["C_im"]).real + p["D"] * u


def layer_norm(x, g):
    return g * (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)


def loss_fn(params, tokens, labels):
    x = jax.lax.with_sharding_constraint(params["embed"][tokens], NamedSharding(mesh, P("data")))
    for blk in params["blocks"]:
        y = lru(blk["lru"], layer_norm(x, blk["ln"]))
        a, g = jnp.split(jax.nn.gelu(y) @ blk["glu"]["w"] + blk["glu"]["b"], 2, axis=-1)
        x = x + a * jax.nn.sigmoid(g)
    logits = x.mean(1) @ params["head"]["w"] + params["head"]["b"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss, (logits.argmax(-1) == labels).mean()


params = init(jax.random.key(0))
labels = jax.tree_util.tree_map_with_path(lambda path, _: "ssm" if any(getattr(k, "key", None) == "lru" for k in path) else "rest", params)
schedule = optax.warmup_cosine_decay_schedule(0.0, 2e-3, warmup_steps=6, decay_steps=args.steps)
tx = optax.chain(optax.clip_by_global_norm(1.0),
                 optax.multi_transform({"ssm": optax.adam(lambda s: 0.5 * schedule(s)), "rest": optax.adamw(schedule, weight_decay=0.05)},
                                       labels))
repl, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
params = jax.device_put(params, repl)
opt_state = jax.device_put(tx.init(params), repl)


@jax.jit
def train_step(params, opt_state, tokens, labels):
    (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens, labels)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, acc


def sequences(rng, n):
    tokens = rng.integers(0, VOCAB, (n, LENGTH)).astype(np.int32)
    return tokens, ((tokens == 3).sum(1) > (tokens == 7).sum(1)).astype(np.int32)


rng = np.random.default_rng(30 + args.rank)
with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        tokens, y = (jax.make_array_from_process_local_data(data, a) for a in sequences(rng, args.batch))
        with prof.step(i):  # dagprof (3/3)
            params, opt_state, loss, acc = train_step(params, opt_state, tokens, y)
            jax.block_until_ready(params)
        if i % 6 == 5 and args.rank == 0:
            print(f"step {i}: loss {float(loss):.3f} acc {float(acc):.3f}", flush=True)
