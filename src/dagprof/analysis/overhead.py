"""The framework overhead on the critical path (its nodes' gaps), broken down by where each gap lies and what the trace
recorded in it; nothing inferred beyond that.

- the window's first step of a rank that began it later than the first rank (the replay starts as skewed as the run);
- a gap on a rank's main thread: between two steps (the loop's own code outside the step marker) or inside a step,
  each cut by the host ranges the trace recorded on that thread then (``traces.host_segments``: eager ops such as the
  dataset iterator's ``IteratorGetNext``, a ``tf.function``'s Python side, its tracing), the rest untraced Python; a run
  whose reader records no ranges says so in the label;
- a collective's start after its last rank joined (the transfer began that much later);
- a gap on another thread (an executor's, a collective's issue), by the kind of the op it preceded.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..graph.dag import Graph
from ..graph.provenance import provenance
from ..traces.events import Kind
from ..traces.host_segments import UNTRACED, HostSegments

START_SKEW = "a rank began the window later than the first"
COLLECTIVE_START = "a collective's start after its last rank joined"
NO_RANGES = "host thread (no host ranges recorded)"
UNMATCHED = "host thread (its ranges not matched: a graph averaged or changed since it was measured)"


def overhead_breakdown(g: Graph, nodes: np.ndarray, category: Callable[[int], str]) -> dict[str, float]:
    """Label -> us of the gaps of ``nodes`` (a critical path), largest first; they add up to the path's overhead.
    ``category`` names a node kind (``critical_path.category``)."""
    v = nodes[g.gap[nodes] > 0]
    gap, rank, kind = g.gap[v].astype(np.float64), g.rank[v], g.kind[v]
    main = np.array([g.meta.main_device.get(int(r), -2) for r in rank.tolist()], dtype=np.int64) == g.device[v]
    first = min(g.meta.steps) if g.meta.steps else None
    skew = (kind == Kind.STEP) & (g.step[v] == first) & (rank >= 0)
    out: dict[str, float] = {}

    def add(label: str, us: float) -> None:
        out[label] = out.get(label, 0.0) + us

    shared = rank < 0
    add(COLLECTIVE_START, float(gap[shared & (kind == Kind.COMM)].sum()))
    add("before a shared node", float(gap[shared & (kind != Kind.COMM)].sum()))
    add(START_SKEW, float(gap[skew].sum()))
    other = ~shared & ~skew & ~main
    for k in np.unique(kind[other]).tolist():
        word = {int(Kind.COMM_ENQUEUE): "a collective's issue", int(Kind.COMM_WAIT): "a wait"}.get(k, f"{category(k)} op")
        add(f"another thread, before {word}", float(gap[other & (kind == k)].sum()))
    prov = provenance(g)
    segs = {r: (np.asarray(x.start), np.asarray(x.end), x) for r, x in g.meta.host_segments.items()}
    for j in np.flatnonzero(~shared & ~skew & main).tolist():
        where = "between steps" if kind[j] == Kind.STEP else "in a step"
        seg = segs.get(int(rank[j]))
        end = float(prov.mstart[v[j]]) if prov is not None else float("nan")
        if seg is None or not np.isfinite(end):
            add(f"{where}: {NO_RANGES if seg is None else UNMATCHED}", float(gap[j]))
            continue
        for label, us in _overlap(*seg, end - float(gap[j]), end).items():
            add(f"{where}: {label}", us)
    return dict(sorted(((k, x) for k, x in out.items() if x > 0), key=lambda kv: -kv[1]))


def _overlap(start: np.ndarray, end: np.ndarray, segs: HostSegments, a: float, b: float) -> dict[str, float]:
    """Label -> us of [a, b] each segment's label covers; the rest of [a, b] is ``UNTRACED``."""
    out: dict[str, float] = {}
    for k in range(int(np.searchsorted(end, a, side="right")), int(np.searchsorted(start, b, side="left"))):
        d = min(end[k], b) - max(start[k], a)
        if d > 0:
            name = segs.labels[segs.label[k]]
            out[name] = out.get(name, 0.0) + float(d)
    rest = (b - a) - sum(out.values())
    if rest > 1e-9:
        out[UNTRACED] = out.get(UNTRACED, 0.0) + rest
    return out
