"""A user's JAX script: a small WaveNet-style forecaster (causal dilated 1-D convolutions with gated tanh/sigmoid units,
residual and skip connections) predicting the next sample of noisy synthetic waveforms, data parallel over two processes.

Habits it exercises that the other JAX scripts do not: ``lax.conv_general_dilated`` with ``rhs_dilation`` and causal
left padding, bfloat16 compute with float32 master weights (parameters and inputs cast inside the loss, the loss and
gradients in float32), the Lion optimizer written by hand (sign of an interpolated momentum, decoupled weight decay),
a step skipped under ``lax.cond`` when the gradients are not finite (as loss-scaling code does), dropout switched by a
``static_argnames`` flag (a second compiled program for the evaluation pass every 8 steps), and each process's batch
made global by ``multihost_utils.host_local_array_to_global_array``; ``jax.jit`` with no shardings given (they follow
the arguments).

Two processes on this host (gloo collectives): ``python jax_wavenet_lion.py --out RUN --rank R --world N --port P``.
"""
import argparse
from functools import partial

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
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
ap.add_argument("--blocks", type=int, default=8, help="dilated blocks (dilations 1, 2, 4, 8, 16, 1, 2, 4, ...)")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("dp",))
CH, SKIP, KERNEL, T, LOCAL = 32, 32, 2, 128, 16
DILATIONS = [2 ** (i % 5) for i in range(args.blocks)]


def init(key):
    keys = iter(jax.random.split(key, 4 * len(DILATIONS) + 3))
    conv = lambda cin, cout, k=1: jax.random.normal(next(keys), (k, cin, cout)) * (1.0 / (k * cin)) ** 0.5  # noqa: E731
    blocks = [{"filt": conv(CH, CH, KERNEL), "gate": conv(CH, CH, KERNEL), "res": conv(CH, CH), "skip": conv(CH, SKIP)}
              for _ in DILATIONS]
    return {"inp": conv(1, CH), "blocks": blocks, "out1": conv(SKIP, SKIP), "out2": conv(SKIP, 1)}


def conv1d(x, w, dilation=1):
    pad = (w.shape[0] - 1) * dilation  # causal: pad on the left only
    return jax.lax.conv_general_dilated(x, w, (1,), [(pad, 0)], rhs_dilation=(dilation,), dimension_numbers=("NWC", "WIO", "NWC"))


def forward(p, x, key, dropout):
    p = jax.tree.map(lambda w: w.astype(jnp.bfloat16), p)
    h, skips = conv1d(x.astype(jnp.bfloat16), p["inp"]), 0.0
    for blk, d in zip(p["blocks"], DILATIONS):
        z = jnp.tanh(conv1d(h, blk["filt"], d)) * jax.nn.sigmoid(conv1d(h, blk["gate"], d))
        if dropout:
            key, sub = jax.random.split(key)
            z = jnp.where(jax.random.bernoulli(sub, 0.9, z.shape), z / 0.9, 0).astype(z.dtype)
        h, skips = h + conv1d(z, blk["res"]), skips + conv1d(z, blk["skip"])
    return conv1d(jax.nn.relu(conv1d(jax.nn.relu(skips), p["out1"])), p["out2"]).astype(jnp.float32)


def loss_fn(p, x, key, dropout):
    pred = forward(p, x[:, :-1], key, dropout)
    return jnp.mean((pred - x[:, 1:]) ** 2)


def lion(p, g, m, lr=3e-4, b1=0.9, b2=0.99, wd=0.01):
    upd = jax.tree.map(lambda m, g: jnp.sign(b1 * m + (1 - b1) * g), m, g)
    p = jax.tree.map(lambda w, u: w - lr * (u + wd * w), p, upd)
    return p, jax.tree.map(lambda m, g: b2 * m + (1 - b2) * g, m, g)


@partial(jax.jit, static_argnames=("dropout",), donate_argnums=(0, 1))
def train_step(p, m, x, key, dropout=True):
    loss, g = jax.value_and_grad(loss_fn)(p, x, key, dropout)
    finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(t)) for t in jax.tree.leaves(g)]))
    p, m = jax.lax.cond(finite, lambda: lion(p, g, m), lambda: (p, m))
    return p, m, loss, finite


@partial(jax.jit, static_argnames=("dropout",))
def eval_loss(p, x, key, dropout=False):
    return loss_fn(p, x, key, dropout)


REPL = NamedSharding(mesh, P())
params = jax.device_put(init(jax.random.key(0)), REPL)  # the same key everywhere: the replicas agree
mom = jax.device_put(jax.tree.map(jnp.zeros_like, params), REPL)
rng = np.random.default_rng(5 + args.rank)  # each process its own waveforms
t = np.arange(T + 1, dtype=np.float32)


def local_batch():
    freq, phase = rng.uniform(0.02, 0.2, (LOCAL, 1)), rng.uniform(0, 6.3, (LOCAL, 1))
    wave = np.sin(freq * t + phase) + 0.05 * rng.standard_normal((LOCAL, T + 1))
    return multihost_utils.host_local_array_to_global_array(wave[..., None].astype(np.float32), mesh, P("dp"))


key = jax.random.key(args.rank)
skipped = 0
with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with prof.step(step):  # dagprof (3/3)
            key, sub = jax.random.split(key)
            params, mom, loss, finite = train_step(params, mom, local_batch(), sub)
            jax.block_until_ready(params)
        skipped += not bool(finite)
        if step % 8 == 7:
            val = eval_loss(params, local_batch(), sub)
            if args.rank == 0:
                print(f"step {step}: loss {float(loss):.4f} eval {float(val):.4f} skipped {skipped}", flush=True)
