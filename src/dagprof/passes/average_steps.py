"""Replace each op's duration and overhead by its mean over the profiled steps.

Replaying the measured timeline op for op reproduces it by construction; a model of *the*
iteration (what every what-if starts from) must instead predict the measured mean from one
per-op figure each, as dPRO does. Ops are matched across steps by (rank, lane, name, how many
ops of that name came before it on the lane in its step): an op one step has and another lacks
(an extra copy, a data-loader call) then shifts nothing else. An op that has no twin in other
steps keeps its own values.

Background threads (a watchdog's or poller's ``cudaEventQuery`` loop, a loader thread) are host
threads whose ops no op of another lane depends on: only the closing step mark follows them. They are
replayed as measured, op for op, and do not define the iteration: the closing mark no longer
waits for them. Their op counts differ from step to step, so their times have no twins to
average, and an averaged polling chain would end wherever its summed mean gaps fall, long after
the step it polled in.
"""
from __future__ import annotations

import numpy as np

from ..graph.dag import DeviceKind, Graph
from ..traces.events import Kind


def average_steps(g: Graph) -> Graph:
    n = len(g)
    if n == 0:
        return g
    background = background_lanes(g)
    lane = g.device.astype(np.int64)
    key = np.stack([g.rank.astype(np.int64), lane, g.step.astype(np.int64), _base_names(g)], axis=1)
    order = np.lexsort((np.arange(n), key[:, 3], key[:, 2], key[:, 1], key[:, 0]))
    first = np.ones(n, dtype=bool)
    first[1:] = np.any(key[order][1:] != key[order][:-1], axis=1)
    starts = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    occurrence = np.empty(n, dtype=np.int64)
    occurrence[order] = np.arange(n) - starts
    match = np.stack([key[:, 0], key[:, 1], key[:, 3], occurrence], axis=1)
    _, inverse = np.unique(match, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    keep = ~np.isin(g.step, g.meta.steps) | np.isin(lane, background)  # outside the window (its closing mark), background lanes
    counts = np.maximum(np.bincount(inverse, weights=~keep), 1)
    dur = np.bincount(inverse, weights=np.where(keep, 0.0, g.dur)) / counts
    gap = np.bincount(inverse, weights=np.where(keep, 0.0, g.gap)) / counts
    out = g.replace(dur=np.where(keep, g.dur, dur[inverse]), gap=np.where(keep, g.gap, gap[inverse]))
    return _release_closing_marks(out, background)


def background_lanes(g: Graph) -> np.ndarray:
    """Host threads whose ops no op on another device depends on; step marks aside.

    A thread that holds step marks is a main thread. Any other thread whose only edges out lead
    to step marks (the closing mark follows every lane's last op) runs free of the step: nothing
    the iteration computes waits for it. GPU streams are the step's work even when nothing on the
    host waits for them, and collective channels are shared by ranks: neither is background.
    """
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    dst = g.succ.astype(np.int64)
    nd = len(g.devices)
    dev = g.device.astype(np.int64)
    cross = (dev[src] != dev[dst]) & (dev[src] >= 0)
    feeds = np.bincount(dev[src][cross & (g.kind[dst] != Kind.STEP)], minlength=nd)[:nd]
    marks = np.bincount(dev[(g.kind == Kind.STEP) & (dev >= 0)], minlength=nd)[:nd]
    used = np.bincount(dev[dev >= 0], minlength=nd)[:nd]
    lanes = [d for d, device in enumerate(g.devices)
             if device.kind == DeviceKind.HOST and used[d] and not feeds[d] and not marks[d]]
    return np.asarray(lanes, dtype=np.int64)


def _release_closing_marks(g: Graph, background: np.ndarray) -> Graph:
    """Drop the edges from background lanes into step marks, so those lanes do not bound a step."""
    if not len(background):
        return g
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    drop = np.isin(g.device[src], background) & (g.kind[g.succ] == Kind.STEP)
    if not drop.any():
        return g
    indptr = np.zeros(len(g) + 1, dtype=np.int64)
    np.cumsum(np.bincount(src[~drop], minlength=len(g)), out=indptr[1:])
    return g.replace(indptr=indptr, succ=g.succ[~drop])


def _base_names(g: Graph) -> np.ndarray:
    """Name ids with per-instance suffixes (".17", "#5") stripped, so steps share names."""
    base = {}
    ids = np.empty(len(g.names), dtype=np.int64)
    for i, name in enumerate(g.names):
        stem = name.rstrip("0123456789").rstrip(".#")
        ids[i] = base.setdefault(stem, len(base))
    return ids[g.name]
