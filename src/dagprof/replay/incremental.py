"""Incremental replay: after a local change, re-simulate from the first moment it can matter.

Soundness (why the answer equals a full replay): a changed node ``c`` (new
dur/gap/order/device, or new predecessors/successors) is consulted by the event
loop only from the time it becomes ready. In the old run that is ``ready[c]``; in
the new run it cannot be before the last of its NEW predecessors ends, and before
any divergence those end exactly when they did in the old run. So with
``t0 = min_c min(ready_old[c], max old end of c's new predecessors)`` both runs
process identical events before ``t0``. The simulator state at the start of time
``t0`` is rebuilt from the old run (completed nodes final, dispatched nodes in
flight, ready nodes queued, the rest waiting on their unfinished predecessors) and
the ordinary event loop continues from there. Tests check equality with full replays.

A change late in the iteration (a late DDP bucket, the optimizer step) therefore
costs about the work after ``t0`` instead of the whole graph.
"""
from __future__ import annotations

import numpy as np

from ..errors import DagprofError
from ..graph.dag import Graph
from ..graph.replay_result import ReplayResult
from .numba_engine import Arrays, check_done, load_kernels, queue_offsets, simulate


class IncrementalReplayer:
    """Keeps the last run of a graph and updates it after local changes.

    ``IncrementalReplayer(graph).result`` is the full replay; ``update(new_graph, changed)``
    returns the replay of ``new_graph`` (identical to ``replay(new_graph)``) and
    makes ``new_graph`` the current graph. ``changed``: ids of every node whose
    dur/gap/order/device changed or whose predecessor or successor set changed (both
    ends of every added or removed edge); ``None`` finds them by comparing the two
    graphs (O(nodes + edges), still far cheaper than a replay). Node ids and devices
    must stay the same; otherwise ``update`` falls back to a full replay. To undo a
    rejected change, update back to the previous graph with the same ``changed``.
    Needs numba (the state lives in the compiled engine's arrays).
    """

    compact_extra = 4096  # override entries tolerated beyond 5 % of the edges before merging them into the CSR

    def __init__(self, graph: Graph) -> None:
        k = load_kernels()
        if k is None:
            raise DagprofError("incremental replay needs numba, which is not usable here")
        self._k = k
        self._reset(graph)
        self.last_resimulated = len(graph)  # nodes re-simulated by the last update (all, on a full run)
        self.last_t0 = 0.0  # the time the last update resumed from

    def _reset(self, graph: Graph) -> None:
        graph.lint()
        n = len(graph)
        self.graph = graph
        self._a = Arrays.of(graph)
        self._s = simulate(self._k, self._a)
        pindptr, pred = graph.pred_csr
        self._pindptr, self._pred = np.ascontiguousarray(pindptr, np.int64), np.ascontiguousarray(pred, np.int32)
        # predecessor rows changed by updates, kept aside instead of rebuilding the CSR each time
        self._ovr = np.full(n, -1, dtype=np.int64)  # node -> its override row, -1: base row
        self._ov_ptr, self._ov_pred = np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int32)
        self._slot = np.full(n, -1, dtype=np.int64)  # scratch: node -> index in the changed set
        self._pos = np.empty(n, dtype=np.int64)  # node -> its index in the completion order
        self._pos[self._s.done_order] = np.arange(n)
        self.result = self._result(True)

    def _result(self, copy: bool) -> ReplayResult:
        s = self._s
        if not copy:
            return ReplayResult(s.start, s.end, s.gate, "numba")
        return ReplayResult(s.start.copy(), s.end.copy(), s.gate.copy(), "numba")

    def update(self, new: Graph, changed: np.ndarray | list[int] | None = None, copy: bool = True) -> ReplayResult:
        """The replay of ``new``; ``copy=False`` returns arrays the next update overwrites (faster)."""
        old, a_old = self.graph, self._a
        same_devices = len(new.devices) == len(old.devices) and all(
            x.capacity == y.capacity for x, y in zip(new.devices, old.devices))
        if len(new) != len(old) or not same_devices:
            return self._full(new)
        same_edges = new.indptr is old.indptr and new.succ is old.succ
        if not same_edges:
            new.lint_edges()
        a = Arrays.of(new)
        if changed is None:
            same_edges = same_edges or (np.array_equal(a.indptr, a_old.indptr) and np.array_equal(a.succ, a_old.succ))
            changed = self._diff(new, a_old, a, same_edges)
        else:
            changed = self._checked(new, changed)
        if len(changed) == 0:
            self.graph, self._a = new, a
            self.last_resimulated, self.last_t0 = 0, float("inf")
            return self.result
        return self._resimulate(new, a, changed, same_edges, copy)

    def _full(self, new: Graph) -> ReplayResult:
        self._reset(new)
        self.last_resimulated, self.last_t0 = len(new), 0.0
        return self.result

    def _checked(self, new: Graph, changed: np.ndarray | list[int]) -> np.ndarray:
        c = np.unique(np.asarray(changed, dtype=np.int64))
        if len(c) and (c[0] < 0 or c[-1] >= len(new)):
            raise DagprofError(f"changed node ids must be in 0..{len(new) - 1}")
        new.lint_nodes(c)
        return c

    def _diff(self, new: Graph, a_old: Arrays, a: Arrays, same_edges: bool) -> np.ndarray:
        mask = (a_old.dur != a.dur) | (a_old.gap != a.gap) | (a_old.order != a.order) | (a_old.device != a.device)
        if not same_edges:
            self._k.rows_differ(len(a.dur), a_old.indptr, a_old.succ, a.indptr, a.succ, mask)
        c = np.flatnonzero(mask)
        new.lint_nodes(c)
        return c

    def _resimulate(self, new: Graph, a: Arrays, changed: np.ndarray, same_edges: bool, copy: bool) -> ReplayResult:
        k, s, n = self._k, self._s, len(new)
        self._slot[changed] = np.arange(len(changed))
        rows_ptr, rows = k.changed_pred_rows(changed, self._slot, self._pindptr, self._pred, self._ovr, self._ov_ptr,
                                             self._ov_pred, a.indptr, a.succ)
        self._slot[changed] = -1
        t0 = k.first_time_changed(s.ready, s.end, rows_ptr, rows, changed)
        if t0 <= 0.0:  # sources are involved: nothing to keep
            return self._full(new)
        if not same_edges:
            self._set_pred_rows(changed, rows_ptr, rows)
        if not np.array_equal(self._a.device[changed], a.device[changed]):
            s.qoff = queue_offsets(a)
            s.qbuf = np.zeros(int(s.qoff[-1]), np.int64)
        k0 = k.completed_before(s.done_order, s.end, t0)
        k.restore_state(t0, k0, self._pindptr, self._pred, self._ovr, self._ov_ptr, self._ov_pred, self._pos,
                        a.device, a.order, a.capacity, s.indeg, s.ready, s.gate, s.pgate, s.start, s.end, s.disp,
                        s.done_order, s.ev, s.counters, s.busy, s.freed, s.qbuf, s.qoff, s.qlen)
        done = k.run(*a.graph_args(), *s.run_args())
        if done != n:
            self._reset(self.graph)  # the state is half-updated: rebuild the previous run
            check_done(done, n)
        self._pos[s.done_order[k0:]] = np.arange(k0, n)
        self.graph, self._a = new, a
        self.last_resimulated, self.last_t0 = n - k0, float(t0)
        self.result = self._result(copy)
        return self.result

    def _set_pred_rows(self, changed: np.ndarray, rows_ptr: np.ndarray, rows: np.ndarray) -> None:
        """Record the changed nodes' new predecessor rows; fold them into the CSR when they pile up."""
        self._ovr[changed] = len(self._ov_ptr) - 1 + np.arange(len(changed))
        self._ov_ptr = np.concatenate([self._ov_ptr, self._ov_ptr[-1] + rows_ptr[1:]])
        self._ov_pred = np.concatenate([self._ov_pred, rows])
        if len(self._ov_pred) > len(self._pred) // 20 + self.compact_extra:
            self._pindptr, self._pred = self._k.merge_preds(self._pindptr, self._pred, self._ovr, self._ov_ptr,
                                                            self._ov_pred)
            self._ovr[:] = -1
            self._ov_ptr, self._ov_pred = np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int32)
