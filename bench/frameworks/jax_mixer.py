"""A user's JAX script: a small MLP-Mixer on 16x16 images (patches, token- and channel-mixing blocks with LayerNorm and
residuals), data parallel by ``jax.jit`` with ``NamedSharding`` over a ``Mesh`` of the processes: the batch sharded, the
parameters replicated and placed with ``jax.device_put``, XLA's partitioner inserting the gradient all-reduces.

Habits it exercises that jax_jit_embed.py does not: parameters as a nested pytree of blocks (lists of dicts),
``out_shardings``/``in_shardings`` given to ``jax.jit``, momentum SGD with weight decay, a fresh batch every step built
with ``make_array_from_process_local_data`` (host-to-device in the loop), the loss and accuracy returned as metrics and
fetched with ``float()`` every step on rank 0.

Two processes on this host (gloo collectives): ``python jax_mixer.py --out RUN --rank R --world N --port P``.
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
ap.add_argument("--blocks", type=int, default=3)
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("dp",))
REPL, BATCH = NamedSharding(mesh, P()), NamedSharding(mesh, P("dp"))
PATCH, TOKENS, CH, HID, CLASSES = 4, 16, 64, 128, 10


def dense(key, n_in, n_out):
    return {"w": jax.random.normal(key, (n_in, n_out)) / np.sqrt(n_in), "b": jnp.zeros(n_out)}


def init(key):
    keys = jax.random.split(key, 2 + 4 * args.blocks)
    blocks = [{"ln1": jnp.ones(CH), "tok1": dense(keys[2 + 4 * i], TOKENS, HID), "tok2": dense(keys[3 + 4 * i], HID, TOKENS),
               "ln2": jnp.ones(CH), "ch1": dense(keys[4 + 4 * i], CH, HID), "ch2": dense(keys[5 + 4 * i], HID, CH)}
              for i in range(args.blocks)]
    return {"stem": dense(keys[0], PATCH * PATCH * 3, CH), "blocks": blocks, "head": dense(keys[1], CH, CLASSES)}


def layer_norm(x, g):
    return g * (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)


def apply(p, images):
    n = images.shape[0]
    x = images.reshape(n, 4, PATCH, 4, PATCH, 3).transpose(0, 1, 3, 2, 4, 5).reshape(n, TOKENS, -1)
    x = x @ p["stem"]["w"] + p["stem"]["b"]
    for b in p["blocks"]:
        y = layer_norm(x, b["ln1"]).transpose(0, 2, 1)
        y = jax.nn.gelu(y @ b["tok1"]["w"] + b["tok1"]["b"]) @ b["tok2"]["w"] + b["tok2"]["b"]
        x = x + y.transpose(0, 2, 1)
        y = layer_norm(x, b["ln2"])
        x = x + jax.nn.gelu(y @ b["ch1"]["w"] + b["ch1"]["b"]) @ b["ch2"]["w"] + b["ch2"]["b"]
    return x.mean(1) @ p["head"]["w"] + p["head"]["b"]


def loss_fn(p, images, labels):
    logits = apply(p, images)
    loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))
    return loss, jnp.mean(jnp.argmax(logits, -1) == labels)


def train_step(p, mom, images, labels):
    (loss, acc), g = jax.value_and_grad(loss_fn, has_aux=True)(p, images, labels)
    mom = jax.tree_util.tree_map(lambda m, g, w: 0.9 * m + g + 1e-4 * w, mom, g, p)
    p = jax.tree_util.tree_map(lambda w, m: w - 0.05 * m, p, mom)
    return p, mom, {"loss": loss, "acc": acc}


params = jax.device_put(init(jax.random.PRNGKey(0)), REPL)
mom = jax.device_put(jax.tree_util.tree_map(jnp.zeros_like, params), REPL)
step_fn = jax.jit(train_step, in_shardings=(REPL, REPL, BATCH, BATCH), out_shardings=(REPL, REPL, REPL))
rng = np.random.default_rng(args.rank)

with jax_profile(args.out, steps=(6, 14), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        images = jax.make_array_from_process_local_data(BATCH, rng.standard_normal((32, 16, 16, 3)).astype(np.float32))
        labels = jax.make_array_from_process_local_data(BATCH, rng.integers(0, CLASSES, 32).astype(np.int32))
        with prof.step(i):  # dagprof (3/3)
            params, mom, metrics = step_fn(params, mom, images, labels)
            jax.block_until_ready(params)
        if args.rank == 0:
            print(f"step {i}: loss {float(metrics['loss']):.3f} acc {float(metrics['acc']):.2f}", flush=True)
