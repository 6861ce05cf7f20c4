"""The compiled replayer: the reference semantics (``python_engine``) in numba.

Kernels compile once and are cached on disk (``njit(cache=True)``: next to the
sources, else numba's user cache dir, or ``NUMBA_CACHE_DIR``). The first use in a
process warms them up on a tiny graph built here and checks the answer against
the reference, so a broken numba falls back instead of returning wrong numbers.
Numba does no bounds checking: ``Graph.lint`` checks every index before a kernel runs.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from ..errors import DagprofError
from ..graph.dag import DeviceKind, Graph, GraphBuilder
from ..graph.replay_result import ReplayResult
from ..traces.events import Kind
from .python_engine import replay_python


@dataclass
class Arrays:
    """The graph as the kernels take it (contiguous, fixed dtypes)."""

    indptr: np.ndarray
    succ: np.ndarray
    device: np.ndarray
    dur: np.ndarray
    gap: np.ndarray
    order: np.ndarray
    capacity: np.ndarray

    @classmethod
    def of(cls, g: Graph) -> "Arrays":
        c = np.ascontiguousarray
        return cls(c(g.indptr, np.int64), c(g.succ, np.int32), c(g.device, np.int32), c(g.dur, np.float64),
                   c(g.gap, np.float64), c(g.order, np.float64),
                   np.array([int(d.capacity) for d in g.devices], dtype=np.int64))

    def graph_args(self) -> tuple:
        return (self.indptr, self.succ, self.device, self.dur, self.gap, self.order, self.capacity)


@dataclass
class SimState:
    """Every array of the simulator; after ``run`` it describes the finished run.

    ``ready`` = when the node became ready (its last predecessor's end), ``pgate``
    = that predecessor, ``disp`` = when its device took it, ``done_order`` = nodes
    in completion order (what ``incremental`` needs to resume at any time).
    """

    indeg: np.ndarray
    ready: np.ndarray
    gate: np.ndarray
    pgate: np.ndarray
    start: np.ndarray
    end: np.ndarray
    disp: np.ndarray
    done_order: np.ndarray
    ev: np.ndarray
    counters: np.ndarray  # [nodes completed, entries in the completion heap ev]
    busy: np.ndarray
    freed: np.ndarray
    qbuf: np.ndarray
    qoff: np.ndarray
    qlen: np.ndarray
    dirty_flag: np.ndarray
    dirty_list: np.ndarray

    @classmethod
    def empty(cls, a: Arrays) -> "SimState":
        n, nd = len(a.dur), len(a.capacity)
        i64 = np.int64
        return cls(
            indeg=np.zeros(n, i64), ready=np.zeros(n), gate=np.full(n, -1, i64), pgate=np.full(n, -1, i64),
            start=np.zeros(n), end=np.zeros(n), disp=np.zeros(n), done_order=np.zeros(n, i64),
            ev=np.zeros(n, i64), counters=np.zeros(2, i64), busy=np.zeros(nd, i64), freed=np.full(nd, -1, i64),
            qbuf=np.zeros(int(np.count_nonzero(a.device >= 0)), i64), qoff=queue_offsets(a),
            qlen=np.zeros(nd, i64), dirty_flag=np.zeros(nd, np.bool_), dirty_list=np.zeros(nd, i64),
        )

    def run_args(self) -> tuple:
        return (self.indeg, self.ready, self.gate, self.pgate, self.start, self.end, self.disp, self.done_order,
                self.ev, self.counters, self.busy, self.freed, self.qbuf, self.qoff, self.qlen,
                self.dirty_flag, self.dirty_list)


def queue_offsets(a: Arrays) -> np.ndarray:
    """Start of each device's queue segment: a device queues at most the nodes placed on it."""
    counts = np.bincount(a.device[a.device >= 0], minlength=len(a.capacity))
    off = np.zeros(len(a.capacity) + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    return off


def simulate(k: ModuleType, a: Arrays) -> SimState:
    """A full run in the compiled kernels; raises on a cycle like the reference."""
    s = SimState.empty(a)
    k.init_state(*a.graph_args(), s.indeg, s.ready, s.gate, s.pgate, s.start, s.end, s.disp, s.ev, s.counters,
                 s.busy, s.freed, s.qbuf, s.qoff, s.qlen, s.dirty_flag, s.dirty_list)
    check_done(k.run(*a.graph_args(), *s.run_args()), len(a.dur))
    return s


def check_done(done: int, n: int) -> None:
    if done != n:
        raise DagprofError(f"graph has a dependency cycle: {n - done} of {n} nodes can never run")


def _selftest_graph() -> Graph:
    """Ties, a two-slot device, a device-gated start, a resource-free node, gaps."""
    b = GraphBuilder()
    d0 = b.device("t/compute", DeviceKind.COMPUTE)
    d1 = b.device("t/comm", DeviceKind.COMM, capacity=2)
    a = b.add_node("a", Kind.FORWARD, device=d0, dur=2.0, order=0)
    c = b.add_node("c", Kind.FORWARD, device=d0, dur=1.0, gap=0.5, order=1)
    s = b.add_node("s", Kind.SYNC, dur=0.0)
    x = b.add_node("x", Kind.COMM, device=d1, dur=3.0, order=2)
    y = b.add_node("y", Kind.COMM, device=d1, dur=3.0, order=2)
    z = b.add_node("z", Kind.COMM, device=d1, dur=1.0, order=1)
    e = b.add_node("e", Kind.UPDATE, device=d0, dur=1.0, order=3)
    b.add_edges([a, a, s, s, s, x, y, z], [s, x, y, z, e, e, e, e])
    b.add_edge(c, e)
    return b.build()


@functools.cache
def load_kernels() -> ModuleType | None:
    """The compiled kernels, warmed up and checked; None when numba is unusable here."""
    try:
        from . import kernels as k

        g = _selftest_graph()
        got, want = simulate(k, Arrays.of(g)), replay_python(g)
    except Exception as err:  # no numba, or it cannot compile here: the caller falls back, slower but right
        warnings.warn(f"dagprof: compiled replay unavailable ({type(err).__name__}: {err}); replaying in pure Python",
                      RuntimeWarning, stacklevel=2)
        return None
    if not all(np.array_equal(x, y) for x, y in ((got.start, want.start), (got.end, want.end), (got.gate, want.gate))):
        warnings.warn("dagprof: compiled replay disagrees with the reference on its self-test; replaying in pure Python",
                      RuntimeWarning, stacklevel=2)
        return None
    return k


def replay_numba(g: Graph) -> ReplayResult:
    k = load_kernels()
    if k is None:
        raise DagprofError("the numba replay engine is not available here (is numba installed?); use engine='python'")
    g.lint()
    s = simulate(k, Arrays.of(g))
    return ReplayResult(s.start, s.end, s.gate, "numba")
