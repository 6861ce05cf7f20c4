"""A user's JAX script: a tiny denoising diffusion model (DDPM, epsilon prediction) on synthetic 8x8 single-channel
images: a residual MLP over the flattened noisy image with a sinusoidal timestep embedding added in every block, a
cosine noise schedule, timesteps and noise drawn inside the jitted step; data parallel by ``jax.jit`` over a ``Mesh``
(the batch sharded, parameters replicated, XLA inserting the gradient all-reduces).

Habits it exercises that the other JAX scripts do not: gradient accumulation over 4 micro-batches with
``lax.fori_loop`` inside the jitted step (the gradient pytree as the loop carry), the random key folded with the step
number (``jax.random.fold_in``), an exponential moving average of the weights kept beside them, the train state a
``NamedTuple`` (a pytree) donated to the step, and every process's step time gathered on the host with
``jax.experimental.multihost_utils.process_allgather`` every 4 steps (to spot a straggler) (a host-side collective between steps).

Two processes on this host (gloo collectives): ``python jax_diffusion_accum.py --out RUN --rank R --world N --port P``.
"""
import argparse
import time
from typing import NamedTuple

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
ap.add_argument("--micro", type=int, default=4)
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("data",))
REPL, SHARD = NamedSharding(mesh, P()), NamedSharding(mesh, P(None, "data"))  # batch: (micro, examples, pixels)
PIX, WIDTH, TEMB, BLOCKS, T = 64, 256, 64, 3, 200
alpha_bar = jnp.cos((jnp.arange(T + 1) / T + 0.008) / 1.008 * jnp.pi / 2) ** 2
alpha_bar = alpha_bar / alpha_bar[0]


class TrainState(NamedTuple):
    params: dict
    ema: dict
    mom: dict
    step: jnp.ndarray


def dense(key, n_in, n_out):
    return {"w": jax.random.normal(key, (n_in, n_out)) * np.sqrt(2.0 / n_in), "b": jnp.zeros(n_out)}


def init(key):
    k = jax.random.split(key, 3 + 3 * BLOCKS)
    blocks = [{"t": dense(k[3 + 3 * i], TEMB, WIDTH), "fc1": dense(k[4 + 3 * i], WIDTH, WIDTH), "fc2": dense(k[5 + 3 * i], WIDTH, WIDTH)}
              for i in range(BLOCKS)]
    return {"inp": dense(k[0], PIX, WIDTH), "temb": dense(k[1], TEMB, TEMB), "blocks": blocks, "out": dense(k[2], WIDTH, PIX)}


def timestep_embedding(t):
    freqs = jnp.exp(-jnp.log(10000.0) * jnp.arange(TEMB // 2) / (TEMB // 2))
    angles = t[:, None].astype(jnp.float32) * freqs[None]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], -1)


def eps_model(p, x, t):
    emb = jax.nn.silu(timestep_embedding(t) @ p["temb"]["w"] + p["temb"]["b"])
    h = x @ p["inp"]["w"] + p["inp"]["b"]
    for b in p["blocks"]:
        y = jax.nn.silu(h + emb @ b["t"]["w"] + b["t"]["b"])
        y = jax.nn.silu(y @ b["fc1"]["w"] + b["fc1"]["b"])
        h = h + y @ b["fc2"]["w"] + b["fc2"]["b"]
    return h @ p["out"]["w"] + p["out"]["b"]


def loss_fn(p, x0, key):
    kt, kn = jax.random.split(key)
    t = jax.random.randint(kt, (x0.shape[0],), 1, T + 1)
    noise = jax.random.normal(kn, x0.shape)
    ab = alpha_bar[t][:, None]
    xt = jnp.sqrt(ab) * x0 + jnp.sqrt(1 - ab) * noise
    return jnp.mean((eps_model(p, xt, t) - noise) ** 2)


def train_step(state, batch, key):
    key = jax.random.fold_in(key, state.step)

    def micro_step(i, carry):
        grads, loss = carry
        l, g = jax.value_and_grad(loss_fn)(state.params, batch[i], jax.random.fold_in(key, i))
        return jax.tree_util.tree_map(jnp.add, grads, g), loss + l

    zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
    grads, loss = jax.lax.fori_loop(0, batch.shape[0], micro_step, (zeros, 0.0))
    grads = jax.tree_util.tree_map(lambda g: g / batch.shape[0], grads)
    mom = jax.tree_util.tree_map(lambda m, g: 0.9 * m + g, state.mom, grads)
    params = jax.tree_util.tree_map(lambda w, m: w - 2e-3 * m, state.params, mom)
    ema = jax.tree_util.tree_map(lambda e, w: 0.99 * e + 0.01 * w, state.ema, params)
    return TrainState(params, ema, mom, state.step + 1), loss / batch.shape[0]


params = init(jax.random.PRNGKey(0))
ema = jax.tree_util.tree_map(jnp.copy, params)  # its own buffers: the state is donated
state = jax.device_put(TrainState(params, ema, jax.tree_util.tree_map(jnp.zeros_like, params), jnp.zeros((), jnp.int32)), REPL)
step_fn = jax.jit(train_step, in_shardings=(REPL, SHARD, REPL), out_shardings=(REPL, REPL), donate_argnums=0)
rng = np.random.default_rng(10 + args.rank)
base_key = jax.random.PRNGKey(1)

with jax_profile(args.out, steps=(6, 14), params=state.params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        local = np.tanh(rng.standard_normal((args.micro, 16, PIX))).astype(np.float32)
        batch = jax.make_array_from_process_local_data(SHARD, local)
        t0 = time.perf_counter()
        with prof.step(i):  # dagprof (3/3)
            state, loss = step_fn(state, batch, base_key)
            jax.block_until_ready(state)
        if i % 4 == 3:  # stragglers: every process's step time
            seconds = multihost_utils.process_allgather(np.float32(time.perf_counter() - t0))
            if args.rank == 0:
                print(f"step {i}: loss {float(loss):.4f} step seconds per process {np.round(seconds, 3)}", flush=True)
