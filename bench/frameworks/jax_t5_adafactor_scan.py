"""A user's JAX script: a small encoder-decoder transformer (T5-like: a shared token embedding, 2 encoder blocks of
self-attention, 2 decoder blocks of causal self-attention and cross-attention over the encoder's output, RMSNorm,
no biases) learning a synthetic translation (each target the source reversed and shifted in the vocabulary), teacher
forced; data parallel over the processes.

Habits it exercises that the other JAX scripts do not: gradient accumulation INSIDE one program
(``lax.scan`` over 2 micro-batches of the step's batch, their gradients summed in the carry, one update), each block
under ``jax.checkpoint`` with the ``dots_with_no_batch_dims_saveable`` policy, optax's ``adafactor`` (factored second
moments) behind ``clip_by_global_norm``, ``jax.jit(..., static_argnames=...)``, and the token accuracy returned with
the loss, fetched with ``jax.device_get`` every 4 steps on rank 0, the accumulated gradients pinned replicated with
``with_sharding_constraint`` before the update. Tried first: explicit sharding (``AxisType.Explicit``), whose table
gathers by a batch-sharded index need ``.at[...].get(out_sharding=...)`` spelled out at every lookup.
Two processes on this host (gloo collectives): ``python jax_t5_adafactor_scan.py --out RUN --rank R --world N --port P``.
"""
import argparse
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from dagprof.collect.hooks.jax_profile import jax_profile  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rank", type=int, required=True)
ap.add_argument("--world", type=int, default=2)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--coordinator", default="127.0.0.1", help="rank 0's host (its address)")
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--batch", type=int, default=32, help="per process")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
VOCAB, LEN, DIM, HEADS, LAYERS, MICRO = 64, 16, 64, 4, 2, 2
BOS = 1


def init(key):
    k = iter(jax.random.split(key, 64))
    nrm = lambda *shape: jax.random.normal(next(k), shape) * shape[0] ** -0.5  # noqa: E731
    attn = lambda: {"q": nrm(DIM, DIM), "k": nrm(DIM, DIM), "v": nrm(DIM, DIM), "o": nrm(DIM, DIM)}  # noqa: E731
    ffn = lambda: {"wi": nrm(DIM, 4 * DIM), "wo": nrm(4 * DIM, DIM)}  # noqa: E731
    return {"embed": nrm(VOCAB, DIM), "pos": 0.02 * jax.random.normal(next(k), (LEN, DIM)),
            "enc": [{"n1": jnp.ones(DIM), "att": attn(), "n2": jnp.ones(DIM), "ffn": ffn()} for _ in range(LAYERS)],
            "dec": [{"n1": jnp.ones(DIM), "self": attn(), "n2": jnp.ones(DIM), "cross": attn(), "n3": jnp.ones(DIM),
                     "ffn": ffn()} for _ in range(LAYERS)],
            "enc_norm": jnp.ones(DIM), "dec_norm": jnp.ones(DIM)}


def rms(x, g):
    return g * x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6)


def attention(p, x, mem, causal):
    n, t, s = x.shape[0], x.shape[1], mem.shape[1]
    q, k, v = ((a @ p[w]).reshape(n, -1, HEADS, DIM // HEADS) for a, w in ((x, "q"), (mem, "k"), (mem, "v")))
    scores = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(DIM // HEADS)
    if causal:
        scores = jnp.where(jnp.tril(jnp.ones((t, s), bool)), scores, -1e9)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, -1), v).reshape(n, t, DIM) @ p["o"]


def ffn(p, x):
    return jax.nn.gelu(x @ p["wi"]) @ p["wo"]


remat = partial(jax.checkpoint, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)


@remat
def enc_block(b, x):
    x = x + attention(b["att"], rms(x, b["n1"]), rms(x, b["n1"]), False)
    return x + ffn(b["ffn"], rms(x, b["n2"]))


@remat
def dec_block(b, y, mem):
    y = y + attention(b["self"], rms(y, b["n1"]), rms(y, b["n1"]), True)
    y = y + attention(b["cross"], rms(y, b["n2"]), mem, False)
    return y + ffn(b["ffn"], rms(y, b["n3"]))


def loss_fn(p, src, tgt):
    x = p["embed"][src] + p["pos"]
    for b in p["enc"]:
        x = enc_block(b, x)
    mem = rms(x, p["enc_norm"])
    dec_in = jnp.pad(tgt[:, :-1], ((0, 0), (1, 0)), constant_values=BOS)  # shifted right, BOS first (keeps the batch's sharding)
    y = p["embed"][dec_in] + p["pos"]
    for b in p["dec"]:
        y = dec_block(b, y, mem)
    logits = rms(y, p["dec_norm"]) @ p["embed"].T
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, tgt).mean()
    return loss, (logits.argmax(-1) == tgt).mean()


tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adafactor(learning_rate=3e-3))


@partial(jax.jit, donate_argnums=(0, 1), static_argnames=("micro",))
def train_step(params, opt_state, src, tgt, micro=MICRO):
    def accumulate(carry, batch):
        (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, *batch)
        return jax.tree.map(jnp.add, carry, (grads, loss, acc)), None

    split = lambda a: jnp.swapaxes(a.reshape(a.shape[0] // micro, micro, *a.shape[1:]), 0, 1)  # noqa: E731  (micro-batch axis first, unsharded)
    zero = (jax.tree.map(jnp.zeros_like, params), jnp.zeros(()), jnp.zeros(()))
    (grads, loss, acc), _ = jax.lax.scan(accumulate, zero, (split(src), split(tgt)))
    grads = jax.lax.with_sharding_constraint(jax.tree.map(lambda g: g / micro, grads), NamedSharding(mesh, P()))
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss / micro, acc / micro


def pairs(rng, n):
    src = rng.integers(2, VOCAB, (n, LEN))
    return src.astype(np.int32), ((src[:, ::-1] - 2 + 7) % (VOCAB - 2) + 2).astype(np.int32)


with jax.sharding.set_mesh(mesh):
    repl, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    params = jax.device_put(init(jax.random.key(0)), repl)
    opt_state = jax.device_put(tx.init(params), repl)
    rng = np.random.default_rng(50 + args.rank)
    with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
        for i in range(args.steps):
            src, tgt = (jax.make_array_from_process_local_data(data, a) for a in pairs(rng, args.batch))
            with prof.step(i):  # dagprof (3/3)
                params, opt_state, loss, acc = train_step(params, opt_state, src, tgt)
                jax.block_until_ready(params)
            if i % 4 == 0 and args.rank == 0:
                loss, acc = jax.device_get((loss, acc))
                print(f"step {i}: loss {float(loss):.4f} token accuracy {float(acc):.3f}", flush=True)
