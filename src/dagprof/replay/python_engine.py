"""Reference list-scheduling replayer in pure Python.

It defines the semantics (see ``dagprof.graph.dag``); the compiled engine must
return identical arrays. Event order is fully deterministic: completions are
processed by (time, node id), every device touched at a time is dispatched after
all completions at that time, devices in id order, ready nodes by (order, id).
"""
from __future__ import annotations

import heapq

import numpy as np

from ..errors import DagprofError
from ..graph.dag import Graph
from ..graph.replay_result import ReplayResult


def replay_python(g: Graph) -> ReplayResult:
    n = len(g)
    indptr, succ = g.indptr.tolist(), g.succ.tolist()
    device, dur, gap, order = g.device.tolist(), g.dur.tolist(), g.gap.tolist(), g.order.tolist()
    capacity = [d.capacity for d in g.devices]
    indeg = np.bincount(g.succ, minlength=n).tolist()
    start, end = [0.0] * n, [0.0] * n
    ready = [0.0] * n
    gate = [-1] * n
    busy = [0] * len(g.devices)
    freed_by = [-1] * len(g.devices)
    queues: list[list[tuple[float, int]]] = [[] for _ in g.devices]
    events: list[tuple[float, int]] = []
    dirty: set[int] = set()
    done = 0

    def make_ready(v: int, t: float) -> None:
        d = device[v]
        if d < 0:
            start[v] = t + gap[v]
            end[v] = start[v] + dur[v]
            heapq.heappush(events, (end[v], v))
        else:
            heapq.heappush(queues[d], (order[v], v))
            dirty.add(d)

    def dispatch(t: float) -> None:
        for d in sorted(dirty):
            q = queues[d]
            while q and busy[d] < capacity[d]:
                _, v = heapq.heappop(q)
                if ready[v] < t and freed_by[d] >= 0:
                    gate[v] = freed_by[d]
                start[v] = t + gap[v]
                end[v] = start[v] + dur[v]
                busy[d] += 1
                heapq.heappush(events, (end[v], v))
        dirty.clear()

    for v in range(n):
        if indeg[v] == 0:
            make_ready(v, 0.0)
    dispatch(0.0)
    while events:
        t = events[0][0]
        while events and events[0][0] == t:
            _, u = heapq.heappop(events)
            done += 1
            d = device[u]
            if d >= 0:
                busy[d] -= 1
                freed_by[d] = u
                dirty.add(d)
            for k in range(indptr[u], indptr[u + 1]):
                v = succ[k]
                if end[u] >= ready[v]:
                    ready[v] = end[u]
                    gate[v] = u
                indeg[v] -= 1
                if indeg[v] == 0:
                    make_ready(v, t)
        dispatch(t)
    if done != n:
        raise DagprofError(f"graph has a dependency cycle: {n - done} of {n} nodes can never run")
    return ReplayResult(np.array(start), np.array(end), np.array(gate, dtype=np.int64), "python")
