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
from ..traces.host_segments import UNTRACED

START_SKEW = "a rank began the window later than the first"
COLLECTIVE_START = "a collective's start after its last rank joined"
NO_RANGES = "host thread (no host ranges recorded)"
UNMATCHED = "host thread (its ranges not matched: a graph averaged or changed since it was measured)"


def overhead_breakdown(g: Graph, nodes: np.ndarray, category: Callable[[int], str], gaps: np.ndarray | None = None
                       ) -> dict[str, float]:
    """Label -> us of the gaps of ``nodes`` (a critical path), largest first; they add up to the path's overhead.
    ``category`` names a node kind (``critical_path.category``); ``gaps``: the part of each node's gap counted (the later
    part: a path taken over the iteration's span, ``critical_path``), its whole gap where None."""
    gaps = g.gap[nodes] if gaps is None else gaps
    v = nodes[gaps > 0]
    gap, rank, kind = gaps[gaps > 0].astype(np.float64, copy=False), g.rank[v], g.kind[v]
    main = _by_rank(g.meta.main_device, rank, -2) == g.device[v]
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
    j = np.flatnonzero(~shared & ~skew & main)
    for label, us in _main_thread(g, v[j], gap[j], rank[j], kind[j] == Kind.STEP).items():
        add(label, us)
    return dict(sorted(((k, x) for k, x in out.items() if x > 0), key=lambda kv: -kv[1]))


def _by_rank(values: dict[int, int], rank: np.ndarray, missing: int) -> np.ndarray:
    """``values.get(r, missing)`` for each rank r (a rank's id: 0 and up; -1 and below: none), as one table lookup."""
    table = np.full(max(max(values, default=-1), int(rank.max(initial=-1))) + 2, missing, dtype=np.int32)
    table[list(values)] = list(values.values())
    return table[np.maximum(rank, -1)]  # the last slot: no rank


def _main_thread(g: Graph, v: np.ndarray, gap: np.ndarray, rank: np.ndarray, between: np.ndarray) -> dict[str, float]:
    """Label -> us of the main-thread gaps ``v`` (in path order; ``between``: a step's own gap, before it), each cut by
    its rank's host segments (``_overlap``), or labelled as one where its rank recorded none or they do not match.

    Each label's parts are added in path order (each gap's in the order ``_overlap`` gives) by ``np.bincount``, which
    adds its weights in order, and the labels come in the order first met: the floats, and the order of ties, of a walk
    that adds them gap by gap (a million gaps on a path: one Python step each was most of ``analyze``'s time)."""
    prov = provenance(g)
    ids: dict[str, int] = {UNTRACED: 0, NO_RANGES: 1, UNMATCHED: 2}  # label -> id, over every rank's segments
    ranged = np.isin(rank, np.array(list(g.meta.host_segments), dtype=np.int64))
    cut = np.flatnonzero(ranged)
    if prov is not None:
        cut = cut[np.isfinite(prov.mstart[v[cut]])]
    else:
        cut = cut[:0]
    rows = []  # (gap, order in it, label id, us) of the cut gaps, rank by rank
    for r in np.unique(rank[cut]).tolist():
        mine = cut[rank[cut] == r]
        segs = g.meta.host_segments[r]
        label = np.array([ids.setdefault(n, len(ids)) for n in segs.labels], dtype=np.int64)[np.asarray(segs.label, dtype=np.int64)]
        end = prov.mstart[v[mine]].astype(np.float64)
        k, order, name, us = _overlap(np.asarray(segs.start, dtype=np.float64), np.asarray(segs.end, dtype=np.float64), label,
                                      end - gap[mine], end)
        rows.append((mine[k], order, name, us))
    n = len(ids)  # key: label id, + n in a step
    # a gap left whole: one label (its rank recorded no ranges, or they do not match), never a segment's
    bare = np.full(len(v), ids[NO_RANGES], dtype=np.int32)
    bare[ranged] = ids[UNMATCHED]
    bare[~between] += n
    bare[cut] = -1
    keep = bare >= 0 if len(cut) else slice(None)  # no copies where no gap is cut (a run without host ranges)
    sums = np.bincount(bare[keep], weights=gap[keep], minlength=2 * n).astype(np.float64, copy=False)  # int when empty
    firsts = [(int(np.argmax(bare == k)), 0, k) for k in np.unique(bare[keep]).tolist()]  # (gap, order in it, key)
    del bare, keep
    if rows:
        at, order, name, us = (np.concatenate(x) for x in zip(*rows))
        by = np.lexsort((order, at))
        at, order, key, us = at[by], order[by], name[by] + np.where(between[at[by]], 0, n), us[by]
        sums += np.bincount(key, weights=us, minlength=2 * n)  # no key is both a whole gap's and a segment's
        seen, first = np.unique(key, return_index=True)
        firsts += [(int(at[i]), int(order[i]), x) for x, i in zip(seen.tolist(), first.tolist())]
    names = list(ids)
    return {f"{'between steps' if k < n else 'in a step'}: {names[k % n]}": float(sums[k]) for _, _, k in sorted(firsts)}


def _overlap(start: np.ndarray, end: np.ndarray, label: np.ndarray, a: np.ndarray, b: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What covers each gap [a[i], b[i]]: the us each segment label covers (its segments' overlaps added in order), the
    rest ``UNTRACED`` (label id 0) where over 1e-9 us. One row per (gap, label): the gap's index, the row's order among
    the gap's (first met; the rest last), the label, the us; rows of one gap in that order."""
    lo = np.searchsorted(end, a, side="right")
    cnt = np.maximum(np.searchsorted(start, b, side="left") - lo, 0)
    gi = np.repeat(np.arange(len(a)), cnt)
    k = np.arange(len(gi)) - np.repeat(np.cumsum(cnt) - cnt, cnt) + np.repeat(lo, cnt)
    d = np.minimum(end[k], b[gi]) - np.maximum(start[k], a[gi])
    keep = d > 0
    gi, d, lab = gi[keep], d[keep], label[k[keep]]
    width = int(label.max(initial=0)) + 1
    groups, first, which = np.unique(gi * width + lab, return_index=True, return_inverse=True)
    covered = np.bincount(which.reshape(-1), weights=d, minlength=len(groups))  # each (gap, label) in order
    rows = np.argsort(first, kind="stable")  # by gap, then first met
    g_of = groups[rows] // width
    within = np.bincount(g_of, weights=covered[rows], minlength=len(a))  # the gap's labels in that order
    rest = (b - a) - within
    tail = np.flatnonzero(rest > 1e-9)
    return (np.concatenate([g_of, tail]), np.concatenate([first[rows], np.full(len(tail), len(gi))]),
            np.concatenate([groups[rows] % width, np.zeros(len(tail), dtype=np.int64)]), np.concatenate([covered[rows], rest[tail]]))
