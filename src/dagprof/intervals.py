"""Unions of time intervals, below every layer: a reader's optimizer steps (``traces.fsdp_run``), a replay's compute and
communication per rank (``analysis.breakdown``) and the threads busy beside a collective (``analysis.operand_stall``)
merge overlapping spans one way."""
from __future__ import annotations

import numpy as np


def union(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The intervals [start, end) merged where they overlap or touch: a sorted, disjoint (k, 2) array (empty ones dropped:
    they cover nothing)."""
    keep = end > start
    if not keep.any():
        return np.empty((0, 2))
    order = np.argsort(start[keep], kind="stable")
    s, e = start[keep][order], end[keep][order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    ends = np.append(run_end[idx[1:] - 1], run_end[-1])
    return np.stack([s[idx], ends], axis=1)


def length(iv: np.ndarray) -> float:
    """The time a disjoint (k, 2) array of intervals (``union``) covers."""
    return float((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0.0


def covered(start: np.ndarray, end: np.ndarray) -> float:
    """The time the intervals cover together (one overlapping another counted once)."""
    return length(union(start, end))


def overlaps(iv: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per query [a[i], b[i]): the time a disjoint, sorted (k, 2) array of intervals (``union``) covers of it."""
    if not len(iv):
        return np.zeros(len(a))
    done = np.concatenate([[0.0], np.cumsum(iv[:, 1] - iv[:, 0])])  # covered before each interval

    def upto(t: np.ndarray) -> np.ndarray:  # covered before t
        k = np.searchsorted(iv[:, 0], t, side="right")  # intervals begun by t
        last = np.maximum(k - 1, 0)
        return np.where(k > 0, done[last] + np.minimum(t, iv[last, 1]) - iv[last, 0], 0.0)

    return np.maximum(upto(np.asarray(b, dtype=np.float64)) - upto(np.asarray(a, dtype=np.float64)), 0.0)
