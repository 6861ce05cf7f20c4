"""A user's JAX script: a small CLIP (Radford et al. 2021, small: a convolutional image tower of two strided
convolutions and a mean pool, a text tower of token and position embeddings and two pre-norm Transformer blocks pooled
at the end-of-text token, each tower projected to a shared space and normalised, a learned temperature) matching
synthetic images of coloured stripes to their synthetic captions, data parallel under ``shard_map``.

Habits it exercises that the other JAX scripts do not: a contrastive loss over the global batch, each process
``lax.all_gather``-ing (tiled) both towers' embeddings inside the differentiated function, so the backward pass sums
their gradients back with a reduce-scatter before the gradients' own ``lax.pmean``; the symmetric cross entropy with
labels offset by ``lax.axis_index``; convolutions by ``lax.conv_general_dilated`` in NHWC; each text block under
``jax.checkpoint`` in a Python loop (not a scan); the learned log-temperature clipped after every update as the paper
does; ``optax.adamw`` with a weight-decay ``mask`` built by ``jax.tree_util.tree_map_with_path`` (no decay on biases,
norm scales and the temperature) under ``optax.cosine_onecycle_schedule``. Two processes on this host (gloo
collectives): ``python jax_clip_gather.py --out RUN --rank R --world N --port P``.
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
ap.add_argument("--batch", type=int, default=64, help="image-caption pairs per process and step")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("data",))
VOCAB, T, D, HEADS, EMBED, SIZE = 64, 12, 96, 4, 64, 24
COLOURS, ANGLES, EOT = 8, 4, 1


def pairs(rng, n):
    """Images of stripes (a colour and an angle) and captions naming both among filler words, ending in EOT."""
    colour, angle = rng.integers(0, COLOURS, n), rng.integers(0, ANGLES, n)
    yy, xx = np.mgrid[:SIZE, :SIZE]
    theta = angle[:, None, None] * np.pi / ANGLES
    stripes = (np.sin((xx * np.cos(theta) + yy * np.sin(theta)) * 1.3) > 0).astype(np.float32)
    palette = np.random.default_rng(0).uniform(0.2, 1.0, (COLOURS, 3)).astype(np.float32)
    img = stripes[..., None] * palette[colour][:, None, None, :] + 0.1 * rng.standard_normal((n, SIZE, SIZE, 3)).astype(np.float32)
    text = rng.integers(2 + COLOURS + ANGLES, VOCAB, (n, T)).astype(np.int32)
    where = rng.integers(0, T - 3, n)
    text[np.arange(n), where] = 2 + colour
    text[np.arange(n), where + 1] = 2 + COLOURS + angle
    ends = rng.integers(where + 2, T, n)
    text[np.arange(n), ends] = EOT
    text[np.arange(T)[None, :] > ends[:, None]] = 0
    return img, text, ends.astype(np.int32)


def dense(key, i, o):
    return {"w": jax.random.normal(key, (i, o)) * np.sqrt(1.0 / i), "b": jnp.zeros(o)}


def init(key):
    k = iter(jax.random.split(key, 16))
    blocks = [{"ln1": jnp.ones(D), "qkv": dense(next(k), D, 3 * D), "o": dense(next(k), D, D), "ln2": jnp.ones(D),
               "up": dense(next(k), D, 4 * D), "down": dense(next(k), 4 * D, D)} for _ in range(2)]
    return {"conv1": jax.random.normal(next(k), (3, 3, 3, 32)) * 0.2, "conv2": jax.random.normal(next(k), (3, 3, 32, 64)) * 0.06,
            "img_proj": dense(next(k), 64, EMBED), "tok": jax.random.normal(next(k), (VOCAB, D)) * 0.02,
            "pos": jax.random.normal(next(k), (T, D)) * 0.01, "blocks": blocks, "ln_f": jnp.ones(D),
            "txt_proj": dense(next(k), D, EMBED), "logit_scale": jnp.array(np.log(1 / 0.07), jnp.float32)}


def norm(x, scale):
    return scale * (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)


def image_tower(p, img):
    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(jax.lax.conv_general_dilated(img, p["conv1"], (2, 2), "SAME", dimension_numbers=dn))
    h = jax.nn.relu(jax.lax.conv_general_dilated(h, p["conv2"], (2, 2), "SAME", dimension_numbers=dn))
    return h.mean((1, 2)) @ p["img_proj"]["w"] + p["img_proj"]["b"]


@jax.checkpoint
def text_block(w, h, pad):
    a = norm(h, w["ln1"])
    q, k, v = (z.reshape(*z.shape[:-1], HEADS, D // HEADS) for z in jnp.split(a @ w["qkv"]["w"] + w["qkv"]["b"], 3, -1))
    att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // HEADS)
    att = jnp.where(pad[:, None, None, :], -1e9, att)
    h = h + jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att, -1), v).reshape(h.shape) @ w["o"]["w"] + w["o"]["b"]
    return h + jax.nn.gelu(norm(h, w["ln2"]) @ w["up"]["w"] + w["up"]["b"]) @ w["down"]["w"] + w["down"]["b"]


def text_tower(p, text, ends):
    h, pad = p["tok"][text] + p["pos"], text == 0
    for w in p["blocks"]:
        h = text_block(w, h, pad)
    pooled = norm(h[jnp.arange(h.shape[0]), ends], p["ln_f"])
    return pooled @ p["txt_proj"]["w"] + p["txt_proj"]["b"]


def loss_fn(p, img, text, ends):
    unit = lambda z: z / jnp.linalg.norm(z, axis=-1, keepdims=True)  # noqa: E731
    zi, zt = unit(image_tower(p, img)), unit(text_tower(p, text, ends))
    all_i = jax.lax.all_gather(zi, "data", tiled=True)  # the global batch: every process's embeddings
    all_t = jax.lax.all_gather(zt, "data", tiled=True)
    scale = jnp.exp(p["logit_scale"])
    labels = jax.lax.axis_index("data") * zi.shape[0] + jnp.arange(zi.shape[0])
    li = optax.softmax_cross_entropy_with_integer_labels(scale * zi @ all_t.T, labels)
    lt = optax.softmax_cross_entropy_with_integer_labels(scale * zt @ all_i.T, labels)
    acc = (jnp.argmax(zi @ all_t.T, -1) == labels).mean()
    return (li.mean() + lt.mean()) / 2, acc


def decays(path, _):
    name = jax.tree_util.keystr(path)
    return not (name.endswith("['b']") or "ln" in name or "logit_scale" in name)


params = init(jax.random.key(0))
schedule = optax.cosine_onecycle_schedule(args.steps, peak_value=3e-3, pct_start=0.25)
tx = optax.adamw(schedule, weight_decay=0.1, mask=jax.tree_util.tree_map_with_path(decays, params))


def step(params, opt_state, img, text, ends):
    (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, img, text, ends)
    grads = jax.lax.pmean(grads, "data")
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    params["logit_scale"] = jnp.clip(params["logit_scale"], 0.0, np.log(100.0))
    return params, opt_state, jax.lax.pmean(loss, "data"), jax.lax.pmean(acc, "data")


DATA = P("data")
train = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P(), DATA, DATA, DATA), out_specs=(P(), P(), P(), P()),
                              check_vma=False))
repl, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, DATA)
params, opt_state = jax.device_put(params, repl), jax.device_put(tx.init(params), repl)
rng = np.random.default_rng(70 + args.rank)

with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        arrays = [jax.make_array_from_process_local_data(sharded, a) for a in pairs(rng, args.batch)]
        with prof.step(i):  # dagprof (3/3)
            params, opt_state, loss, acc = train(params, opt_state, *arrays)
            jax.block_until_ready(params)
        if i % 6 == 5 and args.rank == 0:
            print(f"step {i}: loss {float(loss):.3f} in-batch accuracy {float(acc):.3f}", flush=True)
