"""The global dataflow graph: flat node arrays plus CSR successor lists.

Like torch.fx, the IR is deliberately small: passes are plain functions that take
a ``Graph`` and return a new one (``GraphBuilder.from_graph`` to restructure,
``Graph.replace`` to change columns). Nodes carry what the replayer and the cost
model need, nothing framework specific.

Replay semantics (shared by every replayer, see ``dagprof.replay``): a node is
ready when all predecessors have ended; a device runs at most ``capacity`` nodes
at once, picking the ready node with the smallest ``order``; a node starts
``gap`` us after it was dispatched (the measured framework overhead) and ends
``dur`` us later. Nodes with ``device == -1`` need no resource.
"""
from __future__ import annotations

import enum
import math
from array import array
from dataclasses import dataclass, field, replace as _dc_replace
from functools import cached_property
from typing import Any, Iterable

import numpy as np

from ..errors import DagprofError
from ..traces.events import CommKind, CommRole, Kind, intern
from ..traces.parallelism import Dim
from .meta import GraphMeta

NODE_COLUMNS: dict[str, Any] = {
    "name": np.int32,  # index into Graph.names
    "kind": np.int8,  # traces.events.Kind
    "rank": np.int32,  # -1: belongs to no single rank (a collective's shared transfer)
    "device": np.int32,  # index into Graph.devices, -1: no resource
    "dur": np.float64,  # us
    "gap": np.float64,  # us of overhead between dispatch and start
    "order": np.float64,  # queue priority on the device (profiled start time)
    "step": np.int32,
    "layer": np.int32,  # index into Graph.layers, -1 none
    "bucket": np.int32,
    "nbytes": np.int64,
    "dim": np.int8,  # a COMM node's mesh dimension (traces.parallelism.Dim); read only where meta.parallel is set
    # us: exit lag an averaged collective carries (its last rank's; its consumers': the wire in their gap; passes.average_steps;
    # a Horovod negotiation's: the wire in its span, graph.build)
    "exit_lag": np.float64,
    "role": np.int8,  # a collective's issue, join and transfer: traces.events.CommRole, as its reader set it; PLAIN elsewhere
    "comm_kind": np.uint8,  # a collective's issue, join and transfer: traces.events.CommKind, as its reader or pass set it
    "group_size": np.int32,  # a rank's piece of an op that ran the model's own collective: its group's size (EventTable.group_size); 0 elsewhere
}


_TYPECODE = {c: np.dtype(t).char.replace("l", "q") for c, t in NODE_COLUMNS.items()}  # array.array codes of the same widths


@dataclass(frozen=True, eq=False)
class NodeValues:
    """A float32 value on a few of a graph's nodes (``ids``, ascending), NaN on every other: a column that only some nodes
    carry (``Graph.ready_spread``: shared collectives), 8 bytes a carrier where a dense column costs 4 bytes a node."""

    ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    values: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))

    def at(self, nodes: np.ndarray) -> np.ndarray:
        """The values of ``nodes`` (float32), NaN where none is kept."""
        nodes = np.asarray(nodes, dtype=np.int64)
        out = np.full(nodes.shape, np.nan, dtype=np.float32)
        if len(self.ids) and nodes.size:
            pos = np.minimum(np.searchsorted(self.ids, nodes), len(self.ids) - 1)
            hit = self.ids[pos] == nodes
            out[hit] = self.values[pos[hit]]
        return out

    def renumbered(self, remap: np.ndarray) -> "NodeValues":
        """On the graph a pass made by the old -> new id map ``remap`` (-1: the node dropped)."""
        new = remap[self.ids]
        ok = new >= 0
        order = np.argsort(new[ok], kind="stable")
        return NodeValues(new[ok][order].astype(np.int32), self.values[ok][order])

    def taken(self, old_of_new: np.ndarray) -> "NodeValues":
        """On a graph whose node k is node ``old_of_new[k]`` of this one (a copy may repeat a node: each copy keeps its value)."""
        v = self.at(old_of_new)
        ok = ~np.isnan(v)
        return NodeValues(np.flatnonzero(ok).astype(np.int32), v[ok])

    def where(self, keep: np.ndarray) -> "NodeValues":
        """Only the nodes in the boolean mask ``keep`` keep theirs."""
        ok = np.asarray(keep, dtype=bool)[self.ids]
        return NodeValues(self.ids[ok], self.values[ok])


class DeviceKind(enum.IntEnum):
    COMPUTE = 0  # a CPU thread or GPU stream running compute
    COMM = 1  # a collective channel (one per process group, or per link)
    HOST = 2  # a host thread that only launches work


@dataclass(frozen=True)
class Device:
    name: str
    kind: DeviceKind
    rank: int = -1
    capacity: int = 1  # nodes it runs at once (gloo runs 2 collectives in parallel)


@dataclass
class Graph:
    names: list[str]
    devices: list[Device]
    layers: list[str]
    name: np.ndarray
    kind: np.ndarray
    rank: np.ndarray
    device: np.ndarray
    dur: np.ndarray
    gap: np.ndarray
    order: np.ndarray
    step: np.ndarray
    layer: np.ndarray
    bucket: np.ndarray
    nbytes: np.ndarray
    indptr: np.ndarray  # int64, len n+1
    succ: np.ndarray  # int32 successor ids
    dim: np.ndarray | None = None  # NODE_COLUMNS["dim"]; None (graphs built column by column without it): all Dim.UNKNOWN
    exit_lag: np.ndarray | None = None  # NODE_COLUMNS["exit_lag"]; None: all 0
    role: np.ndarray | None = None  # NODE_COLUMNS["role"]; None: all CommRole.PLAIN
    comm_kind: np.ndarray | None = None  # NODE_COLUMNS["comm_kind"]; None: all CommKind.UNKNOWN
    group_size: np.ndarray | None = None  # NODE_COLUMNS["group_size"]; None: all 0
    # us: a shared collective's spread of its ranks' measured ready points (graph.shared_collectives, read by
    # passes.link_fit.joined_together), on the collectives that have one; NaN: not recorded (one ready rank, a node a pass
    # made or averaged). None: none recorded
    ready_spread: NodeValues | None = None
    meta: GraphMeta = field(default_factory=GraphMeta)

    def __post_init__(self) -> None:
        if self.dim is None:
            self.dim = np.zeros(len(self.dur), dtype=np.int8)
        if self.exit_lag is None:
            self.exit_lag = np.zeros(len(self.dur))
        if self.role is None:
            self.role = np.zeros(len(self.dur), dtype=np.int8)
        if self.comm_kind is None:
            self.comm_kind = np.zeros(len(self.dur), dtype=np.uint8)
        if self.group_size is None:
            self.group_size = np.zeros(len(self.dur), dtype=np.int32)
        if self.ready_spread is None:
            self.ready_spread = NodeValues()

    def lint(self) -> None:
        """Raise DagprofError unless every column and index a replay reads is in range and finite.

        The replay kernels do no bounds checking (numba), so every replay calls this first; a pass can too.
        """
        self.lint_edges()
        self.lint_nodes()

    def lint_edges(self) -> None:
        """Column lengths, the edge index and device capacities."""
        n = len(self)
        for col in ("kind", "rank", "device", "dur", "gap", "order"):
            if len(getattr(self, col)) != n:
                raise DagprofError(f"graph column {col!r} has {len(getattr(self, col))} rows, expected {n}")
        ip = self.indptr
        if len(ip) != n + 1 or ip[0] != 0 or ip[-1] != len(self.succ) or np.any(np.diff(ip) < 0):
            raise DagprofError("graph edge index (indptr) is malformed")
        if len(self.succ) and (int(self.succ.min()) < 0 or int(self.succ.max()) >= n):
            raise DagprofError("graph has an edge to a node that does not exist")
        bad = [d.name for d in self.devices if int(d.capacity) < 1]
        if bad:
            raise DagprofError(f"device {bad[0]!r} has capacity < 1")

    def lint_nodes(self, rows: np.ndarray | None = None) -> None:
        """Node columns in range and finite (only ``rows`` when given: what an incremental update changed)."""
        def col(name: str) -> np.ndarray:
            a = getattr(self, name)
            return a if rows is None else a[rows]

        device = col("device")
        if len(device) and (int(device.min()) < -1 or int(device.max()) >= len(self.devices)):
            raise DagprofError(f"graph node refers to a device outside 0..{len(self.devices) - 1}")
        for name in ("dur", "gap"):
            a = col(name)
            if not np.all(np.isfinite(a)) or (len(a) and float(a.min()) < 0):
                raise DagprofError(f"graph column {name!r} must be finite and >= 0")
        if np.any(np.isnan(col("order"))):
            raise DagprofError("graph column 'order' contains NaN")

    def __len__(self) -> int:
        return len(self.dur)

    @property
    def num_edges(self) -> int:
        return len(self.succ)

    def successors(self, v: int) -> np.ndarray:
        return self.succ[self.indptr[v] : self.indptr[v + 1]]

    @cached_property
    def pred_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, pred) of the reversed graph."""
        src = np.repeat(np.arange(len(self), dtype=np.int32), np.diff(self.indptr))
        order = np.argsort(self.succ, kind="stable")
        counts = np.bincount(self.succ, minlength=len(self))
        indptr = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        return indptr, src[order]

    def predecessors(self, v: int) -> np.ndarray:
        indptr, pred = self.pred_csr
        return pred[indptr[v] : indptr[v + 1]]

    def node_name(self, v: int) -> str:
        return self.names[int(self.name[v])]

    def replace(self, **columns: Any) -> "Graph":
        """A copy with some node columns (or devices/meta) replaced; edges shared, meta copied unless given."""
        for col, arr in columns.items():
            if col in NODE_COLUMNS and np.shape(arr) != (len(self),):
                raise ValueError(f"column {col!r} must have {len(self)} rows")
        cast = {c: np.asarray(a, dtype=NODE_COLUMNS[c]) if c in NODE_COLUMNS else a for c, a in columns.items()}
        cast.setdefault("meta", self.meta.copy())
        g = _dc_replace(self, **cast)
        g.__dict__.pop("pred_csr", None)
        return g

    @property
    def world_size(self) -> int:
        return int(self.rank.max()) + 1 if len(self) else 0

    def ranks(self) -> np.ndarray:
        return np.unique(self.rank[self.rank >= 0])


class _Spent(dict):
    """A consumed builder's columns: any use says so, at no cost to ``add_node`` on a live builder."""

    def __missing__(self, key: str) -> Any:
        raise RuntimeError("this GraphBuilder was spent by build(consume=True); copy the Graph (GraphBuilder.from_graph) to add to it")


class GraphBuilder:
    """Append-only construction; ``build()`` freezes into arrays."""

    def __init__(self) -> None:
        self._cols: dict[str, array] = {c: array(_TYPECODE[c]) for c in NODE_COLUMNS}  # typed: 72 bytes a node, not 16 objects
        self._names: dict[str, int] = {}
        self.names: list[str] = []
        self.devices: list[Device] = []
        self._device_ids: dict[str, int] = {}
        self.layers: list[str] = []
        self._layer_ids: dict[str, int] = {}
        self._spread_ids, self._spread = array("i"), array("f")  # Graph.ready_spread: the nodes that have one, ascending
        self._src: list[np.ndarray | int] = []
        self._dst: list[np.ndarray | int] = []
        self.meta = GraphMeta()

    def __len__(self) -> int:
        return len(self._cols["dur"])

    def intern(self, name: str) -> int:
        return intern(self._names, self.names, name)

    def device(self, name: str, kind: DeviceKind, rank: int = -1, capacity: int = 1) -> int:
        i = self._device_ids.get(name)
        if i is None:
            i = self._device_ids[name] = len(self.devices)
            self.devices.append(Device(name, kind, rank, capacity))
        return i

    def layer(self, name: str) -> int:
        return intern(self._layer_ids, self.layers, name)

    def add_node(
        self,
        name: str,
        kind: Kind,
        *,
        rank: int = -1,
        device: int = -1,
        dur: float = 0.0,
        gap: float = 0.0,
        order: float = 0.0,
        step: int = -1,
        layer: int = -1,
        bucket: int = -1,
        nbytes: int = 0,
        dim: int = Dim.DP,  # passes and builders of data-parallel jobs; graph.build sets each collective's label
        role: int = CommRole.PLAIN,
        comm_kind: int = CommKind.UNKNOWN,
        group_size: int = 0,
        ready_spread: float = np.nan,
    ) -> int:
        c = self._cols
        c["name"].append(self.intern(name))
        c["kind"].append(int(kind))
        c["rank"].append(int(rank))
        c["device"].append(int(device))
        c["dur"].append(max(float(dur), 0.0))
        c["gap"].append(max(float(gap), 0.0))
        c["order"].append(float(order))
        c["step"].append(int(step))
        c["layer"].append(int(layer))
        c["bucket"].append(int(bucket))
        c["nbytes"].append(int(nbytes))
        c["dim"].append(int(dim))
        c["exit_lag"].append(0.0)
        c["role"].append(int(role))
        c["comm_kind"].append(int(comm_kind))
        c["group_size"].append(int(group_size))
        if not math.isnan(ready_spread):
            self._spread_ids.append(len(c["dur"]) - 1)
            self._spread.append(float(ready_spread))
        return len(c["dur"]) - 1

    def add_nodes(self, **columns: np.ndarray) -> np.ndarray:
        """Many nodes at once (what ``add_node`` does per node, on arrays: durations and gaps clamped at 0);
        ``name`` holds interned ids. Returns their ids."""
        n = len(columns["name"])
        first = len(self)
        for col, values in self._cols.items():
            given = columns.get(col)
            if given is None:  # add_node's defaults
                zero = col in ("dur", "gap", "order", "nbytes", "exit_lag", "role", "comm_kind", "group_size")
                given = np.full(n, 0 if zero else int(Dim.DP) if col == "dim" else -1)
            elif col in ("dur", "gap"):
                given = np.maximum(np.asarray(given, np.float64), 0.0)
            values.frombytes(memoryview(np.ascontiguousarray(given, NODE_COLUMNS[col])).cast("B"))  # no bytes copy
        return np.arange(first, first + n, dtype=np.int64)

    def add_edge(self, u: int, v: int) -> None:
        self._src.append(u)
        self._dst.append(v)

    def add_edges(self, src: Iterable[int] | np.ndarray, dst: Iterable[int] | np.ndarray) -> None:
        self._src.append(np.asarray(src, dtype=np.int64))
        self._dst.append(np.asarray(dst, dtype=np.int64))

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Every edge added so far, as (sources, destinations)."""
        if not self._src:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        if len(self._src) == 1 and isinstance(self._src[0], np.ndarray) and isinstance(self._dst[0], np.ndarray):
            return self._src[0], self._dst[0]  # add_edges' int64 arrays as they are: no copy of every edge at the build's peak
        return (np.concatenate([np.atleast_1d(np.asarray(s, dtype=np.int64)) for s in self._src]),
                np.concatenate([np.atleast_1d(np.asarray(d, dtype=np.int64)) for d in self._dst]))

    def set_edges(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Replace every edge (a pass that rewires some of a copied graph's edges)."""
        self._src, self._dst = [np.asarray(src, dtype=np.int64)], [np.asarray(dst, dtype=np.int64)]

    def chain(self, nodes: Iterable[int]) -> None:
        """Edges n0 -> n1 -> n2 ... (program order on a lane)."""
        arr = np.asarray(list(nodes), dtype=np.int64)
        if len(arr) > 1:
            self.add_edges(arr[:-1], arr[1:])

    def build(self, consume: bool = False) -> Graph:
        """The graph of every node and edge added. ``consume``: for a builder that is done, each column is released as
        soon as it is copied (the peak holds one column twice, not all 72 bytes a node), and the builder is unusable after."""
        n = len(self)
        cols = {}
        for c in list(self._cols):
            cols[c] = np.frombuffer(self._cols[c], dtype=NODE_COLUMNS[c]).copy()
            if consume:
                del self._cols[c]
        spread = NodeValues(np.frombuffer(self._spread_ids, np.int32).copy(), np.frombuffer(self._spread, np.float32).copy())
        src, dst = self.edges()
        if consume:
            self._src, self._dst = [], []
            self._cols = _Spent()
        return csr_graph(n, src, dst, names=self.names, devices=self.devices, layers=self.layers, meta=self.meta, ready_spread=spread, **cols)

    @classmethod
    def from_graph(cls, g: Graph, keep: np.ndarray | None = None) -> tuple["GraphBuilder", np.ndarray]:
        """A builder holding ``g``'s nodes (those in the boolean mask ``keep``) and the edges among them.

        Returns the builder and the old->new id map (-1 for dropped nodes), so a
        pass can delete nodes, add new ones and rewire.
        """
        keep = np.ones(len(g), dtype=bool) if keep is None else keep
        b = cls()
        b.names, b._names = list(g.names), {s: i for i, s in enumerate(g.names)}
        b.devices, b._device_ids = list(g.devices), {d.name: i for i, d in enumerate(g.devices)}
        b.layers, b._layer_ids = list(g.layers), {s: i for i, s in enumerate(g.layers)}
        b.meta = g.meta.copy()
        for c in NODE_COLUMNS:
            b._cols[c] = array(_TYPECODE[c], np.ascontiguousarray(getattr(g, c)[keep], dtype=NODE_COLUMNS[c]).tobytes())
        remap = np.full(len(g), -1, dtype=np.int64)
        remap[keep] = np.arange(int(keep.sum()))
        spread = g.ready_spread.renumbered(remap)
        b._spread_ids, b._spread = (array(t, np.ascontiguousarray(a, d).tobytes()) for t, a, d in
                                    (("i", spread.ids, np.int32), ("f", spread.values, np.float32)))
        src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
        ms, md = remap[src], remap[g.succ]
        ok = (ms >= 0) & (md >= 0)
        b.add_edges(ms[ok], md[ok])
        return b, remap


def csr_graph(n: int, src: np.ndarray, dst: np.ndarray, **fields: Any) -> Graph:
    """Sort edges by source into CSR, dropping exact duplicates and self-loops."""
    if len(src):
        if src.min() < 0 or dst.min() < 0 or src.max() >= n or dst.max() >= n:
            raise ValueError("edge refers to a node that does not exist")
        ok = src != dst
        key = src[ok] * n
        key += dst[ok]
        del src, dst, ok
        key.sort()  # np.unique, in place: one edge-sized array fewer at the build's peak
        key = key[np.r_[True, key[1:] != key[:-1]]] if len(key) else key
        dst = key % n
        key //= n  # in place: the sources
        src = key
    counts = np.bincount(src, minlength=n) if n else np.zeros(0, np.int64)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Graph(indptr=indptr, succ=dst.astype(np.int32), **fields)


def gaps_apart(g: Graph, v: np.ndarray, label: str) -> Graph:
    """Each node ``v``'s gap moved into a device-less wait before it (named ``NAME (label)``, after ``v``'s predecessors):
    the replay holds a node's device through its gap, so where the gap is not the device's work (a thread waiting for
    work), another node can take the device meanwhile."""
    v = v[g.gap[v] > 0]
    if not len(v):
        return g
    indptr, pred = g.pred_csr
    count = indptr[v + 1] - indptr[v]
    gap = g.gap.copy()
    gap[v] = 0.0
    b, _ = GraphBuilder.from_graph(g.replace(gap=gap))
    wait = b.add_nodes(name=np.array([b.intern(f"{g.node_name(int(x))} ({label})") for x in v], np.int32),
                       kind=g.kind[v], rank=g.rank[v], device=np.full(len(v), -1), gap=g.gap[v],
                       order=g.order[v], step=g.step[v], layer=g.layer[v])
    b.add_edges(np.concatenate([pred[indptr[x]:indptr[x + 1]] for x in v]), np.repeat(wait, count))
    b.add_edges(wait, v)
    return b.build()
