"""Gradient accumulation: k micro-batches per optimizer step, all but the last under ``no_sync``.

Each profiled step becomes k micro-batches on every rank: k - 1 copies of the step's own
compute (its forward, backward and framework time up to the end-of-backward wait; no
collectives, no optimizer) run first, then the step as profiled (its backward all-reduces
the accumulated gradients). Time per micro-batch is the step time over k: the figure to
compare with the profiled step, since each micro-batch is one profiled batch. This changes the
effective batch, so dagprof offers it only when asked.
"""
from __future__ import annotations

import numpy as np

from ..errors import DagprofError
from ..graph.dag import Graph, GraphBuilder
from ..traces.events import Kind
from .gradients import backward_passes
from .link_fit import priced_comm

_COPIED = (Kind.FORWARD, Kind.BACKWARD, Kind.OTHER, Kind.DATA, Kind.KERNEL)


def accumulate_gradients(g: Graph, k: int) -> Graph:
    """Every step preceded by ``k - 1`` micro-batches without communication (``meta.micro_batches = k``)."""
    check_accumulation(g, k)
    if k == 1:
        return g
    b, _ = GraphBuilder.from_graph(g)
    moved: dict[int, float] = {}  # step markers given an earlier order
    marks = np.flatnonzero((g.kind == Kind.STEP) & (g.rank >= 0))
    for m in marks.tolist():
        step, rank = int(g.step[m]), int(g.rank[m])
        mine = np.flatnonzero((g.step == step) & (g.rank == rank) & (g.device == g.device[m]) & (np.arange(len(g)) != m))
        mine = mine[np.argsort(g.order[mine], kind="stable")]
        waits = [int(w) for w in mine[g.kind[mine] == Kind.COMM_WAIT] if "finalize" in g.node_name(int(w))]
        body = mine[np.isin(g.kind[mine], [int(x) for x in _COPIED])]
        if waits:
            body = body[g.order[body] < g.order[waits[-1]]]
        if not len(body):
            continue
        first = int(mine[0])
        n = len(body) * (k - 1)
        base, top = float(g.order[m]), float(g.order[first])
        if base >= top:  # the marker starts with the step's first op: both moved into the gap before it on the lane
            below = g.order[(g.device == g.device[m]) & (g.order < top)]
            lo = float(below.max()) if len(below) else top - 1.0
            base = max(lo + (top - lo) / (n + 2), float(np.nextafter(lo, np.inf)))
            moved[m] = base
        # strictly below the first op: lanes are re-chained by (order, node id) (passes.buckets.chain_lanes), and the
        # first op's id is lower than its copies'; ties among the copies and with the marker keep creation order
        orders = np.minimum(base + (top - base) * np.arange(1, n + 1) / (n + 1), np.nextafter(top, -np.inf)).tolist()
        prev = m
        for copy in range(k - 1):  # program order by explicit edges: marker -> copies -> the step's first op
            for j, v in enumerate(body.tolist()):
                c = b.add_node(f"{g.node_name(v)} (micro-batch {copy + 1})", Kind(int(g.kind[v])), rank=rank, device=int(g.device[v]),
                               dur=float(g.dur[v]), gap=float(g.gap[v]), order=orders[copy * len(body) + j],
                               step=step, layer=int(g.layer[v]))
                b.add_edge(prev, c)
                prev = c
        b.add_edge(prev, first)
    out = b.build()
    if moved:
        order = out.order.copy()
        order[list(moved)] = list(moved.values())
        out = out.replace(order=order)
    out.meta.micro_batches = k
    return out


def check_accumulation(g: Graph, k: int) -> None:
    """Refuse in one line ``k`` micro-batches a step where ``accumulate_gradients`` does not model them: asked up front
    (``search.optimize``), so that the refusal does not hang on whether a timed search reached that candidate."""
    if k < 1:
        raise DagprofError(f"micro-batches per step must be >= 1, got {k}")
    if k == 1:
        return
    if (passes := backward_passes(g)) > 1:  # its copies would repeat every pass: k times the job's own micro-batches, mis-said
        raise DagprofError(f"not modelled: gradient accumulation on a job that already accumulates ({passes} backward passes a step "
                           "under no_sync); profile it with one micro-batch a step to ask for more")
    other = (g.kind == Kind.COMM) & (g.rank < 0) & ~priced_comm(g)  # a hybrid job's TP/PP/EP/unknown collectives
    if other.any():  # they run in every micro-batch, but the copies hold compute only (TP inside the ops that issue it is copied)
        raise DagprofError(f"not modelled: gradient accumulation on a hybrid job whose {int(other.sum())} tensor/pipeline/expert-parallel "
                           f"collectives have their own nodes (its collectives: {g.meta.parallel.describe()}); the micro-batch copies would drop them")
