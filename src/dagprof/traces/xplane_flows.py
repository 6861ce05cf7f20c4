"""Who scheduled what, across the threads of one XPlane host: the intra-rank dependencies of TF/JAX ops.

The thread pools of TensorFlow and XLA record every task they run: ``ThreadpoolListener::Record``
(context id ``_p``, type 15) on the thread that scheduled it, ``StartRegion`` (``_c``) ..
``StopRegion`` around it on the thread that ran it. Threads outside instrumented pools (TF's
collective executor) are linked by producer/consumer ranges instead (``_p``/``_pt`` ->
``_c``/``_ct``): there the outermost consumer range is the task.

A task's first op depends on what was running where the task was scheduled: the latest op that
started on that thread within the scheduling task, else (a task without ops, e.g. a closure that
only schedules more work) the same question one level up. When a task's own producer is a thread
nobody scheduled (a network completion queue), the contexts consumed inside it are asked next.
Every op also inherits the main-thread moment its chain of tasks started from (its dispatch),
which tells the reader when the main thread's work was done.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .events import Kind

POOL = 15  # tsl::profiler::ContextType::kThreadpoolEvent


@dataclass
class Line:
    """What one thread recorded about scheduling (times in us; contexts as (type, id))."""

    records: list[tuple[float, tuple[int, int]]] = field(default_factory=list)  # producer ranges' starts
    tasks: list[tuple[float, float, tuple[int, int]]] = field(default_factory=list)  # pool tasks: start, end, context
    consumers: list[tuple[float, float, tuple[int, int]]] = field(default_factory=list)  # consumer ranges


@dataclass
class Schedule:
    flows: list[tuple[int, int]]  # op row -> op row
    main_sources: list[tuple[float, int]]  # (main-thread time, first op row of the work it scheduled)
    dispatch: np.ndarray  # per table row: the main-thread time its work descends from, NaN none


def schedule(lines: dict[int, Line], nodes: dict[int, tuple[np.ndarray, np.ndarray]], main: int,
             start: np.ndarray, end: np.ndarray, kind: np.ndarray, step: np.ndarray) -> Schedule:
    """``nodes``: line -> (starts, table rows) of its depth-0 ops, sorted by start."""
    records: dict[tuple[int, int], tuple[int, float]] = {}
    starts, ends, lanes, ctxs = [], [], [], []
    for k, ln in lines.items():
        for t, c in ln.records:
            records.setdefault(c, (k, t))
        for t0, t1, c in ln.tasks:
            starts.append(t0), ends.append(t1), lanes.append(k), ctxs.append(c)
    pool = _Index(np.array(starts), np.array(ends), np.array(lanes, dtype=np.int64))
    inner: dict[int, list[tuple[int, int]]] = {}  # pool task -> contexts consumed inside it, in time order
    for k, ln in lines.items():
        if not ln.consumers:
            continue
        cons = sorted(ln.consumers, key=lambda c: (c[0], -c[1]))
        host = pool.find_all(k, np.array([c[0] for c in cons]))
        outer_end = -np.inf
        for (t0, t1, c), h in zip(cons, host.tolist()):
            if h >= 0:
                inner.setdefault(h, []).append(c)
            elif t0 >= outer_end:  # outside any pool task and any consumer range kept: a task of its own
                outer_end = t1
                starts.append(t0), ends.append(t1), lanes.append(k), ctxs.append(c)
    tasks = _Index(np.array(starts), np.array(ends), np.array(lanes, dtype=np.int64))
    resolve = _Resolver(tasks, ctxs, inner, records, nodes, main)

    n = len(start)
    task_of = np.full(n, -1, dtype=np.int64)
    firsts = []  # (start, row, task) of the first op of each task
    for k, (st, rows) in nodes.items():
        if k == main or not len(rows):
            continue
        reg = tasks.find_all(k, st)
        task_of[rows] = reg
        first = np.r_[True, reg[1:] != reg[:-1]] & (reg >= 0)
        firsts += list(zip(st[first].tolist(), rows[first].tolist(), reg[first].tolist()))
    firsts.sort()
    root = np.full(len(ctxs), np.nan)  # per task: the dispatch it descends from
    flows: list[tuple[int, int]] = []
    main_sources: list[tuple[float, int]] = []
    fallback = _LastBefore(nodes, main, start, end, step)
    srcs = resolve.many([r for _t, _row, r in firsts])
    for (t, row, r), src in zip(firsts, srcs):
        if src[0] == "none" and kind[row] == Kind.COMM:
            src = fallback(row)  # its scheduling was not recorded (a window cut through it)
        if src[0] == "main":
            root[r] = src[1]
            main_sources.append((src[1], row))
        elif src[0] == "node":
            u = src[1]
            if task_of[u] >= 0:
                root[r] = root[task_of[u]]
            if u != row and start[u] <= t + 1e-3:
                flows.append((u, row))
    dispatch = np.full(n, np.nan)
    has = task_of >= 0
    dispatch[has] = root[task_of[has]]
    seq_flows: list[tuple[int, int]] = []
    for _st, rows in nodes.values():  # collectives outside any task whose scheduling was not recorded
        for row in rows[(task_of[rows] < 0) & (kind[rows] == Kind.COMM)].tolist():
            src = fallback(row)
            if src[0] == "node":
                flows.append((src[1], row))
                dispatch[row] = dispatch[src[1]]
        # a collective on a thread that also computes (XLA on CPU) blocks that thread; there it also follows the collective
        # before it (XLA's sharded programs run their all-gathers back to back): without that flow its join had no
        # predecessor and replayed at once, ahead of everything before it
        comm = kind[rows] == Kind.COMM
        computes = not comm.all()
        for j in np.flatnonzero(comm).tolist():
            if j > 0 and (computes or not comm[j - 1]):
                flows.append((int(rows[j - 1]), int(rows[j])))
            if j + 1 < len(rows) and not comm[j + 1]:
                flows.append((int(rows[j]), int(rows[j + 1])))
        # an op whose task names no dispatch continues the work of the op before it on its thread in the same step (XLA's
        # CPU client runs a program's thunks, its collectives among them, one after another on one thread)
        orphan = np.flatnonzero(np.isnan(dispatch[rows[1:]])) + 1
        seq_flows += [(int(rows[j - 1]), int(rows[j])) for j in orphan.tolist() if step[rows[j]] == step[rows[j - 1]]]
    _inherit_dispatch(dispatch, flows + seq_flows, start)
    return Schedule(flows, main_sources, dispatch)


def _inherit_dispatch(dispatch: np.ndarray, links: list[tuple[int, int]], start: np.ndarray) -> None:
    """An op whose own task names no dispatch (it ran outside every pool task, or its task's scheduling was not resolved,
    as the thunks around a collective on XLA's CPU client) belongs to the dispatch of the op that released it or ran before
    it on its thread,
    so the main thread's wait for that dispatch is a wait for it too: without this, a ``block_until_ready`` whose program
    ends after an all-reduce waited, in the graph, on an op before the all-reduce and kept the rest as a fixed gap."""
    if not links:
        return
    src, dst = np.array(links, dtype=np.int64).T
    for k in np.argsort(start[dst], kind="stable").tolist():  # a link goes forward in time: its source is settled first
        if np.isnan(dispatch[dst[k]]) and not np.isnan(dispatch[src[k]]):
            dispatch[dst[k]] = dispatch[src[k]]


class _Index:
    """Tasks per line, sorted by start, for "which task holds this moment"."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray, lanes: np.ndarray):
        self.by: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for k in np.unique(lanes).tolist():
            ids = np.flatnonzero(lanes == k)
            ids = ids[np.argsort(starts[ids], kind="stable")]
            self.by[k] = (starts[ids], ends[ids], ids)

    def find(self, k: int, t: float) -> int:
        if k not in self.by:
            return -1
        st, en, ids = self.by[k]
        j = int(np.searchsorted(st, t, side="right")) - 1
        return int(ids[j]) if j >= 0 and en[j] >= t else -1

    def find_all(self, k: int, ts: np.ndarray) -> np.ndarray:
        if k not in self.by or not len(ts):
            return np.full(len(ts), -1, dtype=np.int64)
        st, en, ids = self.by[k]
        j = np.searchsorted(st, ts, side="right") - 1
        jj = np.clip(j, 0, None)
        return np.where((j >= 0) & (en[jj] >= ts), ids[jj], -1)


class _Resolver:
    def __init__(self, tasks: _Index, ctxs: list, inner: dict, records: dict, nodes: dict, main: int):
        self.tasks, self.ctxs, self.inner, self.records, self.nodes, self.main = tasks, ctxs, inner, records, nodes, main
        self.task_start = np.zeros(len(ctxs))
        self.task_lane = np.full(len(ctxs), -1, dtype=np.int64)
        for k, (st, _en, ids) in tasks.by.items():
            self.task_start[ids] = st
            self.task_lane[ids] = k
        self.memo: dict[int, tuple] = {}

    def local(self, k: int, t: float) -> tuple[tuple | None, int]:
        """What ran on line ``k`` at ``t``: (an answer, -1) or (None, the task to ask whoever scheduled)."""
        if k == self.main:
            return ("main", t), -1
        r = self.tasks.find(k, t)
        lo = self.task_start[r] if r >= 0 else -np.inf
        if k in self.nodes:
            st, rows = self.nodes[k]
            j = int(np.searchsorted(st, t, side="right")) - 1
            if j >= 0 and st[j] >= lo:
                return ("node", int(rows[j])), -1
        return (None, r) if r >= 0 else (("none",), -1)

    def many(self, task_ids: list[int]) -> list[tuple]:
        """``effective`` for many tasks. In bulk while the question is the simple one (a task scheduled
        from the main thread, or from a thread running an op of the scheduling task; else, with no
        other contexts to ask, the task above); the rest one by one."""
        out: list[tuple | None] = [None] * len(task_ids)
        cur = list(task_ids)
        todo = list(range(len(task_ids)))
        for _ in range(64):
            up: list[int] = []
            by_line: dict[int, list[tuple[int, float]]] = {}
            for pos in todo:
                r = cur[pos]
                rec = self.records.get(self.ctxs[r])
                if rec is not None:
                    by_line.setdefault(rec[0], []).append((pos, rec[1]))
            for k, items in by_line.items():
                pos = np.array([p for p, _ in items], dtype=np.int64)
                ts = np.array([t for _, t in items])
                if k == self.main:
                    for p, t in zip(pos.tolist(), ts.tolist()):
                        out[p] = ("main", t)
                    continue
                reg = self.tasks.find_all(k, ts)
                ok = np.zeros(len(ts), bool)
                if k in self.nodes and len(self.nodes[k][0]):
                    st, rows = self.nodes[k]
                    lo = np.where(reg >= 0, self.task_start[np.clip(reg, 0, None)], -np.inf)
                    j = np.searchsorted(st, ts, side="right") - 1
                    ok = (j >= 0) & (st[np.clip(j, 0, None)] >= lo)
                    for p, row in zip(pos[ok].tolist(), rows[j[ok]].tolist()):
                        out[p] = ("node", row)
                for p, r in zip(pos[~ok].tolist(), reg[~ok].tolist()):
                    if r >= 0 and cur[p] not in self.inner:  # other contexts to ask first: one by one
                        cur[p] = r
                        up.append(p)
            if not up:
                break
            todo = up
        return [o if o is not None else self.effective(r) for o, r in zip(out, cur)]

    def effective(self, r0: int) -> tuple:
        """("node", row) | ("main", time) | ("none",) for task ``r0``.

        Depth first, as the module doc says: the task's own producer and, when that thread was
        running no op of its task, whoever scheduled that task, all the way up; only then the
        contexts consumed inside the task (those produced inside the task itself say nothing).
        Iterative: chains can be long."""
        if self.memo.get(r0, ("none",))[0] != "none":
            return self.memo[r0]
        parent: dict[int, int] = {}
        stack = [(r0, 0)]
        answer: tuple = ("none",)
        found_at = -1
        while stack:
            r, i = stack.pop()
            if i == 0:
                if r in self.memo:
                    if self.memo[r][0] != "none":
                        answer, found_at = self.memo[r], r
                        break
                    continue  # explored already (a dead end, or on the current path)
                self.memo[r] = ("none",)
            ctxs = [self.ctxs[r], *self.inner.get(r, [])]
            if i >= len(ctxs):
                continue
            stack.append((r, i + 1))
            rec = self.records.get(ctxs[i])
            if rec is None or (i > 0 and rec[0] == self.task_lane[r] and rec[1] >= self.task_start[r]):
                continue
            found, up = self.local(*rec)
            if found is not None and found[0] != "none":
                answer, found_at = found, r
                break
            if up >= 0 and self.memo.get(up, ("unseen",))[0] != "none":  # unexplored, or settled by an earlier call
                parent[up] = r
                stack.append((up, 0))
        r = found_at
        while r >= 0:  # the chain that led to the answer shares it
            self.memo[r] = answer
            r = parent.get(r, -1) if r != r0 else -1
        return answer


class _LastBefore:
    """The op of the same step (off the main thread) that ended last before a given op started."""

    def __init__(self, nodes: dict, main: int, start: np.ndarray, end: np.ndarray, step: np.ndarray):
        rows = np.concatenate([r for k, (_s, r) in nodes.items() if k != main] or [np.zeros(0, np.int64)])
        self.start = start
        self.by: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for s in np.unique(step[rows]).tolist():
            mine = rows[step[rows] == s]
            order = np.argsort(end[mine], kind="stable")
            self.by[s] = (end[mine][order], mine[order])
        self.step = step

    def __call__(self, row: int) -> tuple:
        ends, rows = self.by.get(int(self.step[row]), (np.zeros(0), np.zeros(0, np.int64)))
        j = int(np.searchsorted(ends, self.start[row] + 1e-3, side="right")) - 1
        while j >= 0 and rows[j] == row:
            j -= 1
        return ("node", int(rows[j])) if j >= 0 else ("none",)
