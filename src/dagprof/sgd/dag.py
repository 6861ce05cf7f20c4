"""The S-SGD DAG as a dagprof ``Graph``, replayed by ``dagprof.replay``: the model the closed forms solve.

Nodes per worker r and iteration i: IO, H2D (a loader device), F_1..F_L, B_L..B_1, U
(the worker's compute device); per iteration one node per all-reduce group on a single
shared channel (capacity 1, ``order`` = backward position, so C_{l+1} goes before C_l).
Edges: IO -> H2D -> F_1 -> ... -> F_L -> B_L -> ... -> B_1; B_lo(g) of EVERY worker -> C_g
(B_1 when communication waits for the whole backward); every C_g -> U of every worker;
U_i -> F_1 of i+1; the next IO follows H2D_i (prefetch) or U_i (no prefetch).
Replaying a few iterations and differencing the last two ends gives the steady state.
"""
from __future__ import annotations

import numpy as np

from ..errors import DagprofError
from ..graph.dag import DeviceKind, Graph, GraphBuilder
from ..graph.meta import SgdRecord
from ..replay import replay
from ..traces.events import Kind
from ..traces.layerwise import LayerProfile
from .closed import Prediction
from .contention import Contention, contended_replay
from .schedule import Schedule


def build_sgd_graph(profile: LayerProfile, schedule: Schedule, iterations: int = 3) -> Graph:
    b = GraphBuilder()
    n, workers = profile.num_layers, schedule.workers
    channel = b.device("allreduce channel", DeviceKind.COMM, capacity=1)
    gpus = [b.device(f"worker {r} compute", DeviceKind.COMPUTE, rank=r) for r in range(workers)]
    loaders = [b.device(f"worker {r} loader", DeviceKind.HOST, rank=r) for r in range(workers)]
    layer_ids = [b.layer(name) for name in profile.names]
    forward = profile.forward_or_zero()
    group_bytes = [int(profile.grad_bytes[lo:hi].sum()) for lo, hi in zip(schedule.group_lo, schedule.group_hi)]
    prev_u: list[int | None] = [None] * workers
    prev_h2d: list[int | None] = [None] * workers
    for it in range(iterations):
        last_b = np.empty((workers, n), dtype=np.int64)  # B node of each worker and layer
        updates = []
        for r in range(workers):
            io = b.add_node(f"w{r}.i{it}.IO", Kind.DATA, rank=r, device=loaders[r], dur=profile.io_us, step=it, order=2 * it)
            h2d = b.add_node(f"w{r}.i{it}.H2D", Kind.MEMCPY, rank=r, device=loaders[r], dur=profile.h2d_us, step=it, order=2 * it + 1)
            b.add_edge(io, h2d)
            before_io = prev_h2d[r] if schedule.prefetch_io else prev_u[r]
            if before_io is not None:
                b.add_edge(before_io, io)
            chain = [b.add_node(f"w{r}.i{it}.F.{profile.names[l]}", Kind.FORWARD, rank=r, device=gpus[r], dur=forward[l], step=it, layer=layer_ids[l])
                     for l in range(n)]
            for l in range(n - 1, -1, -1):
                last_b[r, l] = b.add_node(f"w{r}.i{it}.B.{profile.names[l]}", Kind.BACKWARD, rank=r, device=gpus[r], dur=profile.backward_us[l],
                                          step=it, layer=layer_ids[l], nbytes=int(profile.grad_bytes[l]))
                chain.append(int(last_b[r, l]))
            u = b.add_node(f"w{r}.i{it}.U", Kind.UPDATE, rank=r, device=gpus[r], dur=profile.update_us, step=it)
            chain.append(u)
            b.chain(chain)
            b.add_edge(h2d, chain[0])
            if prev_u[r] is not None:
                b.add_edge(prev_u[r], chain[0])
            prev_u[r], prev_h2d[r] = u, h2d
            updates.append(u)
        for g in range(schedule.num_groups):
            lo = int(schedule.group_lo[g])
            c = b.add_node(f"i{it}.C.{profile.names[lo]}+{schedule.group_hi[g] - lo - 1}", Kind.COMM, device=channel, dur=schedule.comm_us[g], step=it,
                           order=it * (schedule.num_groups + 1) + g, layer=layer_ids[lo], bucket=g, nbytes=group_bytes[g])
            b.add_edges(last_b[:, lo if schedule.overlap_comm else 0], np.full(workers, c))
            b.add_edges(np.full(workers, c), updates)
    b.meta.sgd = SgdRecord(schedule.policy.value, workers, iterations)
    return b.build()


def replay_schedule(profile: LayerProfile, schedule: Schedule, iterations: int = 3, contention: Contention | None = None) -> Prediction:
    """Steady-state figures from replaying ``iterations`` (>= 2) iterations of the DAG; ``contention``: with compute and
    all-reduces slowing each other (``contended_replay``)."""
    if iterations < 2:
        raise ValueError("need at least two iterations to measure a steady state")
    g = build_sgd_graph(profile, schedule, iterations)
    result = replay(g) if contention is None else contended_replay(g, contention)
    last, prev = g.step == iterations - 1, g.step == iterations - 2
    upd = g.kind == Kind.UPDATE
    iteration = float(result.end[upd & last].max() - result.end[upd & prev].max())
    first_b = last & (g.kind == Kind.BACKWARD) & (g.layer == 0)
    backward_end = float(result.end[first_b].max())
    comm = last & (g.kind == Kind.COMM)
    comm_end = float(result.end[comm].max()) if comm.any() else backward_end
    t_f, t_b = float(profile.forward_or_zero().sum()), float(profile.backward_us.sum())
    comm_us = float((result.end[comm] - result.start[comm]).sum())
    return Prediction(iteration, max(comm_end - backward_end, 0.0), comm_us, t_f + t_b + profile.update_us)


def replay_jitter(profile: LayerProfile, schedule: Schedule, samples: int = 64, iterations: int = 4, seed: int = 0,
                  contention: Contention | None = None) -> float:
    """Mean iteration (us) when every worker, every iteration, runs the layer times of one profiled step drawn at random.

    The closed forms give every worker the same (median) times; in a real job each all-reduce waits
    for the slowest worker's gradient, so the iteration follows the expected maximum over workers of
    their step-to-step variation, more so with more workers. A drawn step scales each layer's time by
    its ratio to that layer's mean over steps, and shifts the update by its difference from the mean
    update: both are 1 (0) on average, so one worker's iteration keeps the anchored time, and an
    anchored or scaled profile keeps its own level. Workers draw independently; the iteration is the
    mean over ``iterations`` - 1 steady iterations of ``samples`` replays (seeded: the same inputs
    give the same answer). ``contention``: each sample replayed with compute and all-reduces slowing each other.
    """
    if profile.step_backward_us is None or profile.step_forward_us is None or profile.step_update_us is None:
        raise DagprofError("no per-step layer times to draw from (only dagprof run folders have them)", profile.source or None)
    if iterations < 2 or samples < 1:
        raise ValueError("need at least two iterations and one sample")
    g = build_sgd_graph(profile, schedule, iterations)

    def ratio(table: np.ndarray) -> np.ndarray:
        mean = table.mean(axis=0)
        return np.divide(table, mean, out=np.ones_like(table), where=mean > 0)

    scale = {Kind.FORWARD: ratio(profile.step_forward_us), Kind.BACKWARD: ratio(profile.step_backward_us)}
    shift = profile.step_update_us - profile.step_update_us.mean()
    nodes = {k: np.flatnonzero(g.kind == k) for k in (Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE)}
    steps = len(shift)
    upd = nodes[Kind.UPDATE]
    first, last = upd[g.step[upd] == 0], upd[g.step[upd] == iterations - 1]
    rng = np.random.default_rng(seed)
    total = 0.0
    for _ in range(samples):
        draw = rng.integers(steps, size=(iterations, schedule.workers))  # the profiled step each worker runs, per iteration
        dur = g.dur.copy()
        for k in (Kind.FORWARD, Kind.BACKWARD):
            idx = nodes[k]
            dur[idx] = g.dur[idx] * scale[k][draw[g.step[idx], g.rank[idx]], g.layer[idx]]
        dur[upd] = np.maximum(g.dur[upd] + shift[draw[g.step[upd], g.rank[upd]]], 0.0)
        end = (replay(g.replace(dur=dur)) if contention is None else contended_replay(g, contention, dur)).end
        total += (end[last].max() - end[first].max()) / (iterations - 1)
    return total / samples
