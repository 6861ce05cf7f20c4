"""Communication scheduling: which ready bucket (or partition) the channel serves first.

The replayer serves a device's ready nodes by ``order``; a collective's order is normally
when it became ready (FIFO, what DDP and gloo do). ``set_comm_priority`` ranks buckets instead
(ByteScheduler / P3: the layers the next forward needs first -- the last buckets of backward --
go first). It pays only where something waits for some buckets and not others: under DDP every
bucket must finish before the optimizer and the next forward, and DDP issues buckets in ready
order, so the search does not offer it for DDP jobs (it is a what-if for other engines).
"""
from __future__ import annotations

import numpy as np

from ..errors import DagprofError
from ..graph.dag import Graph
from ..traces.events import Kind


def set_comm_priority(g: Graph, priority: list[int] | str = "fifo") -> Graph:
    """``priority``: bucket indices, most urgent first; "fifo" (ready order) or "lifo" (last bucket first)."""
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.bucket >= 0))
    if not len(comm):
        raise DagprofError("the graph has no bucket all-reduce to schedule")
    order = g.order.copy()
    for step in np.unique(g.step[comm]).tolist():
        mine = comm[g.step[comm] == step]
        buckets = sorted(set(g.bucket[mine].tolist()))
        if priority == "fifo":
            continue
        if priority == "lifo":
            rank_of = {bk: i for i, bk in enumerate(reversed(buckets))}
        elif isinstance(priority, (list, tuple)):
            rank_of = {int(bk): i for i, bk in enumerate(priority)}
            missing = [bk for bk in buckets if bk not in rank_of]
            if missing:
                raise DagprofError(f"priority list lacks bucket {missing[0]} (step {step})")
        else:
            raise DagprofError(f"priority must be 'fifo', 'lifo' or a list of buckets, got {priority!r}")
        base = float(g.order[mine].min())
        for v in mine.tolist():  # within the step, by rank; the step's place among steps kept
            order[v] = base + 1e-3 * rank_of[int(g.bucket[v])]
    return g.replace(order=order)
