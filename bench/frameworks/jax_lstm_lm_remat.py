"""A user's JAX script: a character-level LSTM language model (an embedding, one LSTM layer unrolled with ``lax.scan``
over the sequence, a tied-size output projection) on synthetic text, data parallel by ``jax.jit`` with
``NamedSharding``: the batch sharded over the processes, the parameters and optimizer state replicated, XLA's
partitioner inserting the gradient all-reduces.

Habits it exercises that the other JAX scripts do not: ``jax.checkpoint`` (rematerialisation) of the scanned LSTM
cell with ``prevent_cse=False`` (as JAX's docs advise inside ``scan``), an LSTM written as one fused gate matmul, optax
``chain(clip_by_global_norm, adam)`` wrapped in ``optax.inject_hyperparams`` (the learning rate lives in the optimizer
state, a user's linear decay written into it between steps), dropout with a fresh ``jax.random.fold_in(key, step)`` every
step, the batch placed with ``jax.device_put`` of each process's own rows through ``make_array_from_process_local_data``,
and the per-token loss returned as a metric and read with ``.item()`` every 5 steps.

Two processes on this host (gloo collectives): ``python jax_lstm_lm_remat.py --out RUN --rank R --world N --port P``.
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
ap.add_argument("--window", default="6:14", help="the profiled steps A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("data",))
REPL, BATCH = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
VOCAB, EMB, HID, SEQ = 96, 64, 256, 32


def init_params(key):
    k = jax.random.split(key, 4)
    return {"embed": jax.random.normal(k[0], (VOCAB, EMB)) * 0.1,
            "lstm": {"w": jax.random.normal(k[1], (EMB + HID, 4 * HID)) / np.sqrt(EMB + HID), "b": jnp.zeros(4 * HID)},
            "out": {"w": jax.random.normal(k[2], (HID, VOCAB)) / np.sqrt(HID), "b": jnp.zeros(VOCAB)}}


def lstm_cell(p, carry, x):
    h, c = carry
    i, f, g, o = jnp.split(jnp.concatenate([x, h], -1) @ p["w"] + p["b"], 4, axis=-1)
    c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h


def loss_fn(params, tokens, key):
    x = params["embed"][tokens[:, :-1]]  # (B, T, E)
    x = jnp.where(jax.random.bernoulli(key, 0.9, x.shape), x / 0.9, 0.0)  # embedding dropout
    cell = jax.checkpoint(lambda carry, xt: lstm_cell(params["lstm"], carry, xt), prevent_cse=False)
    zeros = jnp.zeros((tokens.shape[0], HID))
    _, hs = jax.lax.scan(cell, (zeros, zeros), jnp.swapaxes(x, 0, 1))  # over time
    logits = jnp.swapaxes(hs, 0, 1) @ params["out"]["w"] + params["out"]["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


tx = optax.inject_hyperparams(lambda learning_rate: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(learning_rate)))(
    learning_rate=3e-3)
params = jax.device_put(init_params(jax.random.key(0)), REPL)
opt_state = jax.device_put(tx.init(params), REPL)


@jax.jit
def train_step(params, opt_state, tokens, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


rng = np.random.default_rng(args.rank)
text = rng.integers(0, VOCAB, (args.batch * 8, SEQ + 1)).astype(np.int32)  # this process's own sequences
base_key = jax.random.key(42)

with jax_profile(args.out, steps=args.window, params=params) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        rows = text[(step % 8) * args.batch:(step % 8 + 1) * args.batch]
        tokens = jax.make_array_from_process_local_data(BATCH, rows)
        opt_state.hyperparams["learning_rate"] = jnp.asarray(3e-3 * (1 - step / (2 * args.steps)))  # linear decay
        opt_state = jax.device_put(opt_state, REPL)
        with prof.step(step):  # dagprof (3/3)
            params, opt_state, loss = train_step(params, opt_state, tokens, jax.random.fold_in(base_key, step))
            jax.block_until_ready(params)
        if step % 5 == 0 and args.rank == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
