"""Compute slowed by the communication beside it (Echo's overlap slowdown), on a replayed timeline.

On CPU-only jobs the network stack and the collectives' threads use the cores that compute: an
op that overlaps in-flight collectives for a fraction f of its time takes (1 + s * f) times its
undisturbed duration, with s measured on the job's own ranks (``collect.measure.overlap``). A profile's
durations already include the slowdown of the overlap it had, so a what-if first removes that
(``undisturbed``: durations over 1 + s * f of the profiled timeline), then charges the overlap of the
new timeline (``disturbed``); one replay in between gives f. Two replays per candidate instead of one.
"""
from __future__ import annotations

import numpy as np

from ..graph.dag import Graph
from ..graph.replay_result import ReplayResult
from ..traces.events import Kind

SLOWED = (Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE, Kind.OTHER, Kind.KERNEL)


def slowed_nodes(g: Graph) -> np.ndarray:
    return np.flatnonzero((g.rank >= 0) & np.isin(g.kind, [int(k) for k in SLOWED]))


def comm_overlap(g: Graph, res: ReplayResult, nodes: np.ndarray) -> np.ndarray:
    """Per node: the fraction of its [start, end] during which some collective was in flight (``res``: a replay of ``g``)."""
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.dur > 0))
    if not len(comm) or not len(nodes):
        return np.zeros(len(nodes))
    s, e = _union(res.start[comm], res.end[comm])
    busy = np.r_[0.0, np.cumsum(e - s)]  # busy time before each interval

    def busy_until(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s, t, side="right")  # intervals starting at or before t
        inside = np.clip(t - s[np.maximum(k - 1, 0)], 0.0, (e - s)[np.maximum(k - 1, 0)])
        return busy[np.maximum(k - 1, 0)] + np.where(k > 0, inside, 0.0)

    a, b = res.start[nodes], res.end[nodes]
    span = np.maximum(b - a, 1e-9)
    return np.clip((busy_until(b) - busy_until(a)) / span, 0.0, 1.0)


def undisturbed(g: Graph, res: ReplayResult, slowdown: float) -> np.ndarray:
    """Durations of ``g`` with the slowdown of its own replayed overlap removed."""
    dur = g.dur.copy()
    if slowdown > 0:
        nodes = slowed_nodes(g)
        dur[nodes] = g.dur[nodes] / (1.0 + slowdown * comm_overlap(g, res, nodes))
    return dur


def disturbed(g: Graph, base_dur: np.ndarray, res: ReplayResult, slowdown: float) -> np.ndarray:
    """``base_dur`` (undisturbed) slowed by the overlap of ``res``, a replay of ``g``."""
    dur = g.dur.copy()
    nodes = slowed_nodes(g)
    dur[nodes] = base_dur[nodes] * (1.0 + slowdown * comm_overlap(g, res, nodes))
    return dur


def _union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    run_end = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > run_end[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return s[first], run_end[last]
