"""The graph under construction: nodes with their measured intervals, edges with their rules, and the gaps (overhead)
that follow from both once every rank and collective is in (``graph.build``).

``graph.rank_nodes`` adds each rank's pieces and flows; ``graph.shared_collectives`` adds one node per collective
instance from what every rank recorded of it (``CollectiveEnd``).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from ..traces.events import Kind
from .dag import Graph, GraphBuilder
from .measured import Provenance


@dataclass
class CollectiveEnd:
    """One rank's view of a collective instance (times on the rank's clock, in us from ``base_ns``)."""

    rank: int
    base_ns: int  # the rank's clock origin, aligned: ``base_ns/1e3 + t`` is on the shared clock
    start: float
    end: float
    prev_end_group: float  # completion of this rank's previous collective in the same group
    ready: list[tuple[int, int]] = field(default_factory=list)  # (node, rule) it waits on (enqueue)
    needs: list[tuple[int, int]] = field(default_factory=list)  # (node, rule) that wait on it
    after: list[tuple[int, int]] = field(default_factory=list)  # (instance, rule): collectives it waits on (XLA runs them back to back)
    name: str = ""
    nbytes: int = 0
    bucket: int = -1
    step: int = -1
    lanes: int = 1
    group: str = "0"
    dim: int = 0  # traces.parallelism.Dim
    role: int = 0  # traces.events.CommRole
    comm_kind: int = 0  # traces.events.CommKind


class Assembler:
    """What the builder has added so far; ``finish`` derives the gaps and returns the graph."""

    def __init__(self) -> None:
        self.b = GraphBuilder()
        self.mstart = array("d")  # measured dependent instant per node (rank-local clock); NaN: shared
        self.mend = array("d")
        self.src: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []
        self.rule: list[np.ndarray] = []
        self.seen: list[np.ndarray] = []  # u's end as v's rank saw it, NaN: u's own measured end
        self.instances: dict[int, list[CollectiveEnd]] = {}
        self.fixed_gap: dict[int, float] = {}  # shared nodes: gap not derivable from one clock
        self.comm_lanes = 1  # most collectives a rank ran at once (threads or streams they used)
        self.first_marks: dict[int, float] = {}  # each rank's first step boundary -> its start on the shared clock
        self.base_ns: dict[int, int] = {}  # rank -> its clock's origin, aligned

    def node(self, name: str, kind: Kind, mstart: float, mend: float, dur: float | None = None, order: float | None = None, **kw) -> int:
        """A node measured on [mstart, mend] (NaN: on no single clock; give ``dur`` then)."""
        if order is None:
            order = mstart if np.isfinite(mstart) else 0.0
        v = self.b.add_node(name, kind, dur=mend - mstart if dur is None else dur, order=order, **kw)
        self.mstart.append(mstart)
        self.mend.append(mend)
        return v

    def edges(self, u, v, rule, seen=None) -> None:
        u, v = np.atleast_1d(np.asarray(u, np.int64)), np.atleast_1d(np.asarray(v, np.int64))
        ok = (u >= 0) & (v >= 0) & (u != v)
        self.src.append(u[ok])
        self.dst.append(v[ok])
        self.rule.append(np.broadcast_to(np.asarray(rule, np.int16), u.shape)[ok])
        self.seen.append(np.full(int(ok.sum()), np.nan) if seen is None else np.broadcast_to(np.asarray(seen, float), u.shape)[ok])

    def finish(self) -> Graph:
        """The graph, each node's gap its measured start minus the latest measured end of its predecessors."""
        n = len(self.mstart)

        def cat(xs: list[np.ndarray], dt: type) -> np.ndarray:
            out = np.concatenate(xs).astype(dt, copy=False) if xs else np.empty(0, dt)
            xs.clear()  # the assembler is done: its pieces go as each column is joined
            return out

        src, dst, rule, seen = cat(self.src, np.int64), cat(self.dst, np.int64), cat(self.rule, np.int16), cat(self.seen, np.float64)
        # the measured intervals as they are (no copy: nothing is added to the assembler after its finish)
        mstart, mend = np.frombuffer(self.mstart, dtype=np.float64), np.frombuffer(self.mend, dtype=np.float64)
        seen_end = seen  # a copy of its pieces, owned here: u's own end filled in where v's rank saw none
        own = np.flatnonzero(np.isnan(seen_end))
        seen_end[own] = mend[src[own]]
        del own
        latest = np.full(n, -np.inf)
        ok = np.isfinite(seen_end)
        np.maximum.at(latest, dst[ok], seen_end[ok])
        gap = np.where(np.isfinite(latest) & np.isfinite(mstart), np.maximum(mstart - latest, 0.0), 0.0)
        for v, fixed in self.fixed_gap.items():
            gap[v] = fixed
        first = min(self.first_marks.values(), default=0.0)
        for v, t in self.first_marks.items():  # ranks start as skewed as they were measured
            gap[v] = t - first
        self.b.add_edges(src, dst)
        self.b.meta.comm_lanes = self.comm_lanes
        origin = min(self.base_ns.values(), default=0)
        self.b.meta.provenance = Provenance(mstart, mend, src, dst, rule, seen_end, {r: (b - origin) / 1e3 for r, b in self.base_ns.items()})
        return self.b.build(consume=True).replace(gap=gap)
