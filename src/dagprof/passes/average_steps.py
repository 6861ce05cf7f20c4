"""Replace each op's duration and overhead by its mean over the profiled steps.

Replaying the measured timeline op for op reproduces it by construction; a model of *the*
iteration (what every what-if starts from) must instead predict the measured mean from one
per-op figure each, as dPRO does. Ops are matched across steps by (rank, position within
the rank's step, name); an op that has no twin in other steps keeps its own values.
"""
from __future__ import annotations

import numpy as np

from ..graph.dag import Graph


def average_steps(g: Graph) -> Graph:
    n = len(g)
    if n == 0:
        return g
    group = np.stack([g.rank.astype(np.int64), g.step.astype(np.int64)], axis=1)
    order = np.lexsort((np.arange(n), group[:, 1], group[:, 0]))
    first = np.ones(n, dtype=bool)
    first[1:] = np.any(group[order][1:] != group[order][:-1], axis=1)
    starts = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    local = np.empty(n, dtype=np.int64)
    local[order] = np.arange(n) - starts
    key = np.stack([g.rank.astype(np.int64), local, _base_names(g)], axis=1)
    _, inverse, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    dur = np.bincount(inverse, weights=g.dur) / counts
    gap = np.bincount(inverse, weights=g.gap) / counts
    keep = g.step < 0  # ops outside any step stay as measured
    return g.replace(dur=np.where(keep, g.dur, dur[inverse]), gap=np.where(keep, g.gap, gap[inverse]))


def _base_names(g: Graph) -> np.ndarray:
    """Name ids with per-instance suffixes (".17", "#5") stripped, so steps share names."""
    base = {}
    ids = np.empty(len(g.names), dtype=np.int64)
    for i, name in enumerate(g.names):
        stem = name.rstrip("0123456789").rstrip(".#")
        ids[i] = base.setdefault(stem, len(base))
    return ids[g.name]
