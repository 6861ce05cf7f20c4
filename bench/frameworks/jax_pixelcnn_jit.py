"""A user's JAX script: a small gated PixelCNN (van den Oord et al. 2016: masked convolutions so that each pixel sees
only the pixels above and to its left, gated ``tanh * sigmoid`` residual layers, a 16-way softmax over each pixel's
quantised intensity) on synthetic 12x12 grey strokes, trained in bits per dimension.

Habits it exercises that the other JAX scripts do not: the masks multiplied into the kernels inside the loss (type A on
the first layer, B after), so the masked-out weights get zero gradients but still travel; ``jax.jit`` given explicit
``in_shardings`` / ``out_shardings`` (``NamedSharding`` over a one-axis mesh: the batch split over the processes, the
parameters and the optimizer state replicated) and ``donate_argnames``, with XLA's partitioner inserting the gradient
all-reduces itself; the optimizer an ``optax.apply_if_finite`` around ``chain(clip_by_global_norm, adamw)`` (a step
with a non-finite gradient is skipped, its counters in the state), the learning rate by
``optax.warmup_exponential_decay_schedule``; each process's batch from ``make_array_from_process_local_data``; and a
few pixels sampled from the model after training, row by row under ``jax.jit`` of one sampling step. Two processes on
this host (gloo collectives): ``python jax_pixelcnn_jit.py --out RUN --rank R --world N --port P``.
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
ap.add_argument("--batch", type=int, default=16, help="images per process and step")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("data",))
SIZE, LEVELS, CH, LAYERS = 12, 16, 32, 4


def strokes(rng, n):
    """Quantised grey images: one or two thick strokes between random points, blurred a little."""
    yy, xx = np.mgrid[:SIZE, :SIZE].astype(np.float32)
    img = np.zeros((n, SIZE, SIZE), np.float32)
    for _ in range(2):
        y0, x0, y1, x1 = (e[:, None, None] for e in rng.uniform(1, SIZE - 1, (4, n)))
        t = np.clip(((yy - y0) * (y1 - y0) + (xx - x0) * (x1 - x0)) / ((y1 - y0) ** 2 + (x1 - x0) ** 2 + 1e-3), 0, 1)
        dist = np.hypot(yy - (y0 + t * (y1 - y0)), xx - (x0 + t * (x1 - x0)))
        img = np.maximum(img, np.clip(1.6 - dist, 0, 1) * (rng.uniform(size=(n, 1, 1)) < 0.8))
    return np.minimum((img * LEVELS).astype(np.int32), LEVELS - 1)[..., None]


def mask(k, cin, cout, kind):
    """1 above the centre row and left of the centre in it; the centre itself for type B."""
    m = np.zeros((k, k, cin, cout), np.float32)
    m[: k // 2] = 1
    m[k // 2, : k // 2 + (kind == "B")] = 1
    return jnp.asarray(m)


MASKS = {"in": mask(7, 1, CH, "A"), "gate": mask(3, CH, 2 * CH, "B")}


def init(key):
    keys = iter(jax.random.split(key, 3 + 2 * LAYERS))
    glorot = jax.nn.initializers.glorot_uniform()
    return {"in": glorot(next(keys), (7, 7, 1, CH)),
            "layers": [{"gate": glorot(next(keys), (3, 3, CH, 2 * CH)), "gate_b": jnp.zeros(2 * CH),
                        "res": glorot(next(keys), (1, 1, CH, CH)), "res_b": jnp.zeros(CH)} for _ in range(LAYERS)],
            "head": glorot(next(keys), (1, 1, CH, 96)), "head_b": jnp.zeros(96),
            "out": glorot(next(keys), (1, 1, 96, LEVELS)), "out_b": jnp.zeros(LEVELS)}


def conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def logits(p, img):
    x = conv(img.astype(jnp.float32) / (LEVELS - 1) - 0.5, p["in"] * MASKS["in"])
    for layer in p["layers"]:
        a, b = jnp.split(conv(jax.nn.relu(x), layer["gate"] * MASKS["gate"]) + layer["gate_b"], 2, axis=-1)
        x = x + conv(jnp.tanh(a) * jax.nn.sigmoid(b), layer["res"]) + layer["res_b"]
    return conv(jax.nn.relu(conv(jax.nn.relu(x), p["head"]) + p["head_b"]), p["out"]) + p["out_b"]


def bits_per_dim(p, img):
    logp = jax.nn.log_softmax(logits(p, img))
    return -jnp.mean(jnp.take_along_axis(logp, img, axis=-1)) / np.log(2.0)


schedule = optax.warmup_exponential_decay_schedule(1e-4, 2e-3, warmup_steps=5, transition_steps=10, decay_rate=0.7)
tx = optax.apply_if_finite(optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-4)),
                           max_consecutive_errors=3)
repl, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
params = jax.device_put(init(jax.random.key(0)), repl)
opt_state = jax.device_put(tx.init(params), repl)


def train_step(params, opt_state, img):
    loss, grads = jax.value_and_grad(bits_per_dim)(params, img)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


train = jax.jit(train_step, in_shardings=(repl, repl, sharded), out_shardings=(repl, repl, repl),
                donate_argnames=("params", "opt_state"))
rng = np.random.default_rng(90 + args.rank)

with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        img = jax.make_array_from_process_local_data(sharded, strokes(rng, args.batch))
        with prof.step(i):  # dagprof (3/3)
            params, opt_state, loss = train(params, opt_state, img)
            jax.block_until_ready(params)
        if i % 6 == 5 and args.rank == 0:
            print(f"step {i}: {float(loss):.3f} bits/dim, skipped steps {int(opt_state.total_notfinite)}", flush=True)


@jax.jit
def sample_pixel(p, canvas, key, row, col):
    """One pixel of every canvas drawn from the model's distribution given the pixels before it."""
    drawn = jax.random.categorical(key, logits(p, canvas)[:, row, col])
    return canvas.at[:, row, col, 0].set(drawn)


canvas, key = jnp.zeros((2, SIZE, SIZE, 1), jnp.int32), jax.random.key(args.rank)
local = jax.tree_util.tree_map(lambda a: np.asarray(a.addressable_data(0)), params)  # the replicated weights, on this process
for r in range(4):
    for c in range(SIZE):
        key, sub = jax.random.split(key)
        canvas = sample_pixel(local, canvas, sub, r, c)
if args.rank == 0:
    print("sampled first rows:", np.asarray(canvas)[0, :4, :, 0].tolist(), flush=True)
