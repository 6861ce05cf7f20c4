"""A user's JAX script: a physics-informed network (PINN, Raissi et al. 2019) for the 2-D Poisson problem
-lap u = f on the unit square, u = 0 on its edge, with f chosen so that u = sin(pi x) sin(pi y); collocation points
sampled afresh each step, data parallel over the processes.

Habits it exercises that the other JAX scripts do not: second derivatives inside the loss (the Laplacian by the trace
of ``jax.hessian`` of the scalar network, ``jax.vmap``-ed over points), a network as a plain list of ``(W, b)`` tuples
with Fourier-feature inputs, two loss terms (residual, boundary) returned with ``has_aux=True``, learning-rate
annealing of the boundary weight (Wang et al. 2021) every ``--anneal-every`` steps: on those steps the step function
takes each term's gradient apart (a second jitted program, ``jax.lax.cond``-free: Python picks the function), so the
profiled window holds steps of two programs; hand-written Adam with bias correction as a ``NamedTuple`` state, the
relative L2 error against the exact solution printed every 8 steps (``jax.device_get`` of a replicated scalar).
Two processes on this host (gloo collectives): ``python jax_pinn_poisson.py --out RUN --rank R --world N --port P``.
"""
import argparse
from typing import NamedTuple

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
ap.add_argument("--points", type=int, default=256, help="interior collocation points per process")
ap.add_argument("--width", type=int, default=64)
ap.add_argument("--anneal-every", type=int, default=5, help="0: a fixed boundary weight")
ap.add_argument("--window", default="6:14", help="the profiled steps, A:B")
args = ap.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"{args.coordinator}:{args.port}", num_processes=args.world, process_id=args.rank)
mesh = Mesh(np.array(jax.devices()), ("data",))
repl, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
FOURIER = 16


def init(key, width=args.width, depth=4):
    keys = jax.random.split(key, depth + 2)
    fourier = 2.0 * jax.random.normal(keys[0], (2, FOURIER))
    sizes = [2 * FOURIER] + [width] * depth + [1]
    return fourier, [(jax.random.normal(k, (a, b)) * jnp.sqrt(2.0 / (a + b)), jnp.zeros(b))
                     for k, a, b in zip(keys[1:], sizes, sizes[1:])]


def u(params, xy):
    fourier, layers = params
    h = jnp.concatenate([jnp.sin(xy @ fourier), jnp.cos(xy @ fourier)])
    for w, b in layers[:-1]:
        h = jnp.tanh(h @ w + b)
    w, b = layers[-1]
    return (h @ w + b)[0]


def source(xy):
    return 2 * jnp.pi ** 2 * jnp.sin(jnp.pi * xy[..., 0]) * jnp.sin(jnp.pi * xy[..., 1])


def terms(params, inner, edge):
    lap = jax.vmap(lambda p: jnp.trace(jax.hessian(u, argnums=1)(params, p)))(inner)
    residual = jnp.mean((-lap - source(inner)) ** 2)
    boundary = jnp.mean(jax.vmap(u, in_axes=(None, 0))(params, edge) ** 2)
    return residual, boundary


def loss_fn(params, inner, edge, weight):
    residual, boundary = terms(params, inner, edge)
    return residual + weight * boundary, (residual, boundary)


class Adam(NamedTuple):
    m: list
    v: list
    t: jax.Array


def adam(params, grads, state, lr=1e-3, b1=0.9, b2=0.999):
    t = state.t + 1
    m = jax.tree.map(lambda a, g: b1 * a + (1 - b1) * g, state.m, grads)
    v = jax.tree.map(lambda a, g: b2 * a + (1 - b2) * g * g, state.v, grads)
    scale = lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    return jax.tree.map(lambda p, a, b: p - scale * a / (jnp.sqrt(b) + 1e-8), params, m, v), Adam(m, v, t)


@jax.jit
def step(params, state, inner, edge, weight):
    (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, inner, edge, weight)
    params, state = adam(params, grads, state)
    return params, state, weight, aux


@jax.jit
def annealed_step(params, state, inner, edge, weight):
    """Wang et al.'s rule: the boundary weight moves towards max |grad residual| / mean |grad boundary|."""
    g_res = jax.grad(lambda p: terms(p, inner, edge)[0])(params)
    g_bnd = jax.grad(lambda p: terms(p, inner, edge)[1])(params)
    top = jnp.max(jnp.stack([jnp.max(jnp.abs(g)) for g in jax.tree.leaves(g_res)]))
    mean = jnp.mean(jnp.concatenate([jnp.abs(g).ravel() for g in jax.tree.leaves(g_bnd)]))
    weight = 0.9 * weight + 0.1 * top / (mean + 1e-8)
    grads = jax.tree.map(lambda a, b: a + weight * b, g_res, g_bnd)
    params, state = adam(params, grads, state)
    return params, state, weight, terms(params, inner, edge)


@jax.jit
def rel_error(params, xy):
    pred = jax.vmap(u, in_axes=(None, 0))(params, xy)
    exact = jnp.sin(jnp.pi * xy[:, 0]) * jnp.sin(jnp.pi * xy[:, 1])
    return jnp.linalg.norm(pred - exact) / jnp.linalg.norm(exact)


def sample(rng, n):
    inner = rng.random((n, 2))
    side, t = rng.integers(0, 4, n // 4), rng.random(n // 4)
    edge = np.stack([np.where(side < 2, side, t), np.where(side < 2, t, side - 2)], 1)
    return inner.astype(np.float32), edge.astype(np.float32)


params = jax.device_put(init(jax.random.key(0)), repl)
state = jax.device_put(Adam(jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params), jnp.zeros(())), repl)
weight = jax.device_put(jnp.ones(()), repl)
grid = jax.device_put(jnp.asarray(np.stack(np.meshgrid(np.linspace(0, 1, 33), np.linspace(0, 1, 33)), -1).reshape(-1, 2),
                                  dtype=jnp.float32), repl)
rng = np.random.default_rng(17 + args.rank)
with jax_profile(args.out, steps=tuple(map(int, args.window.split(":"))), params=params) as prof:  # dagprof (2/3)
    for i in range(args.steps):
        inner, edge = (jax.make_array_from_process_local_data(data, a) for a in sample(rng, args.points))
        fn = annealed_step if args.anneal_every and i % args.anneal_every == args.anneal_every - 1 else step
        with prof.step(i):  # dagprof (3/3)
            params, state, weight, (res, bnd) = fn(params, state, inner, edge, weight)
            jax.block_until_ready(params)
        if i % 8 == 7 and args.rank == 0:
            print(f"step {i}: residual {float(res):.3g} boundary {float(bnd):.3g} weight {float(weight):.2f} "
                  f"rel L2 {float(jax.device_get(rel_error(params, grid))):.3f}", flush=True)
