"""Compute and all-reduces slowing each other on shared cores, priced on the replayed S-SGD DAG.

On CPU workers the collectives' threads and the network stack run on the cores that compute. Both
directions are measured together by ``collect.measure.overlap`` (``dagprof calibrate --overlap``):
compute overlapping an all-reduce for a fraction f of its time takes (1 + compute * f) times its
undisturbed time, and an all-reduce overlapping compute for a fraction f of its time (1 + comm * f).
Under WFBP each layer's all-reduce runs beside the backward, so on busy cores it does not hide as the
plain recurrence has it; a fused all-reduce after the backward overlaps nothing and is unchanged.
The durations that satisfy both at once are found by damped fixed-point iteration on replays.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph.dag import Graph
from ..graph.replay_result import ReplayResult
from ..passes.overlap import busy_share, comm_overlap, slowed_nodes
from ..replay import replay
from ..traces.events import Kind

MAX_ROUNDS = 60
TOLERANCE = 1e-6  # largest relative change of a duration between rounds


@dataclass(frozen=True)
class Contention:
    """Measured slowdowns per unit of overlap (``Overlap.model_slowdown`` and ``Overlap.comm_slowdown``)."""

    compute: float
    comm: float
    source: str = ""

    def describe(self) -> str:
        return f"compute x(1 + {self.compute:.2f} f) beside all-reduces, all-reduces x(1 + {self.comm:.2f} f) beside compute ({self.source})"


def contended_replay(g: Graph, contention: Contention, dur: np.ndarray | None = None) -> ReplayResult:
    """Replay of ``g`` (durations ``dur``, else its own, taken as undisturbed) with each compute node slowed by its
    share overlapping all-reduces and each all-reduce by its share overlapping its workers' compute (the mean over
    workers), self-consistently."""
    base = g.dur if dur is None else dur
    compute = slowed_nodes(g)
    comm = np.flatnonzero(g.kind == Kind.COMM)
    per_worker = np.full(len(compute), 1.0 / max(len(np.unique(g.rank[compute])), 1))  # a worker computes one node at a time
    cur = base.copy()
    res = replay(g.replace(dur=cur))
    for _ in range(MAX_ROUNDS):
        new = base.copy()
        new[compute] *= 1.0 + contention.compute * comm_overlap(g, res, compute)
        new[comm] *= 1.0 + contention.comm * busy_share(res, compute, comm, per_worker)
        new = 0.5 * (cur + new)  # damped: undamped rounds overshoot and ring
        done = np.max(np.abs(new - cur) / np.maximum(cur, 1e-9), initial=0.0) < TOLERANCE
        cur = new
        res = replay(g.replace(dur=cur))
        if done:
            break
    return res
