"""Which op of one profile is which op of another: keys that survive a re-run.

Node ids, thread ids, step numbers and collective instance numbers all change from one run of
a job to the next; what stays is the rank, the position of the step in the profiled window, the
op's name (without its rank prefix or instance suffix), its layer and its bucket. Two ops with
all of those equal are told apart by their order within the step (the k-th such op on that rank).
Gradient-bucket collectives are keyed by bucket and bytes instead of by name, so a graph made by
a pass (``passes.set_buckets`` names its nodes its own way) matches a measured one wherever the
layouts agree, and a bucket of another size is another op: a difference in structure.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ...graph.dag import Graph, GraphBuilder
from ...passes.buckets import sparse_buckets
from ...traces.events import CommRole, Kind

_INSTANCE = re.compile(r"\.\d+$")
_COLLECTIVE = (Kind.COMM, Kind.SYNC, Kind.COMM_ENQUEUE)
_GLUE = (Kind.OTHER, Kind.COMM_WAIT, Kind.RUNTIME)
_BUCKET_WORD = {Kind.COMM: "all-reduce", Kind.SYNC: "join", Kind.COMM_ENQUEUE: "issue all-reduce"}
_PS_WORD = {Kind.COMM: "push/pull", Kind.SYNC: "join push/pull", Kind.COMM_ENQUEUE: "issue push/pull"}
_FUSED_WORD = {Kind.COMM: "fused all-reduce", Kind.SYNC: "join fused all-reduce", Kind.COMM_ENQUEUE: "issue fused all-reduce"}


def op_label(g: Graph, v: int) -> str:
    """A node's name as another run of the same job would spell it."""
    kind = int(g.kind[v])
    if kind == Kind.STEP:
        return "between steps"
    if kind in _COLLECTIVE and g.bucket[v] >= 0:  # worded as critical_path labels them: a server's key, Horovod's response
        if g.meta.ps:
            return f"{_PS_WORD[Kind(kind)]} key {int(g.bucket[v])}"
        if g.meta.horovod:
            return f"{_FUSED_WORD[Kind(kind)]} {int(g.bucket[v])}"
        word = _BUCKET_WORD[Kind(kind)]
        sparse = g.role[v] == CommRole.SPARSE  # its issue, join or transfer
        return f"{word.replace('all-reduce', 'all-gather sparse') if sparse else word} bucket {int(g.bucket[v])}"
    name = g.node_name(v)
    r = int(g.rank[v])
    if r >= 0:
        prefix = f"rank{r}."
        return name[len(prefix):] if name.startswith(prefix) else name
    name = name[5:] if kind == Kind.SYNC and name.startswith("sync.") else name
    return _INSTANCE.sub("", name)


def counts_as_op(g: Graph) -> np.ndarray:
    """The ops match rates count: a rank's named work, not the glue between it.

    Glue (gaps filled as ``other:*``, host waits, launch calls) is alike in any two trainings, so
    counting it would let unrelated jobs look half the same; a graph with nothing else counts it."""
    mine = (g.rank >= 0) & ~np.isin(g.kind, (Kind.STEP, Kind.SYNC))
    work = mine & ~np.isin(g.kind, _GLUE)
    return work if work.any() else mine


@dataclass
class OpMatch:
    """Pairs of nodes (A id, B id) that are the same op, and what is left over on each side."""

    pairs: np.ndarray  # (k, 2) int64
    a_ops: int  # ops (``counts_as_op``) of the ranks both runs have
    b_ops: int
    matched_ops: int  # of those, matched
    ranks_only_a: list[int] = field(default_factory=list)
    ranks_only_b: list[int] = field(default_factory=list)
    only_a: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # unmatched A nodes (any rank)
    only_b: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    @property
    def fraction_a(self) -> float:
        return self.matched_ops / self.a_ops if self.a_ops else 0.0

    @property
    def fraction_b(self) -> float:
        return self.matched_ops / self.b_ops if self.b_ops else 0.0


def match_ops(a: Graph, b: Graph) -> OpMatch:
    """Pair the nodes of ``a`` and ``b`` by (rank, step position, kind, label, layer, bucket, k-th)."""
    labels = LabelTable()
    layers: dict[str, int] = {"": -1}
    ka, kb = _keys(a, labels, layers), _keys(b, labels, layers)
    _, group = np.unique(np.concatenate([ka, kb]), axis=0, return_inverse=True)
    group = group.reshape(-1)
    ga, gb = group[: len(a)], group[len(a):]
    node_b = np.full(int(group.max()) + 1 if len(group) else 0, -1, dtype=np.int64)
    node_b[gb] = np.arange(len(b))  # keys are unique within a graph (the k-th column)
    hit = node_b[ga] >= 0
    pairs = np.stack([np.flatnonzero(hit), node_b[ga[hit]]], axis=1).astype(np.int64)
    ranks_a, ranks_b = set(a.ranks().tolist()), set(b.ranks().tolist())
    common = np.array(sorted(ranks_a & ranks_b), dtype=np.int64)
    op_a = counts_as_op(a) & np.isin(a.rank, common)
    op_b = counts_as_op(b) & np.isin(b.rank, common)
    seen_a = np.zeros(len(a), dtype=bool)
    seen_b = np.zeros(len(b), dtype=bool)
    seen_a[pairs[:, 0]] = True
    seen_b[pairs[:, 1]] = True
    return OpMatch(
        pairs=pairs, a_ops=int(op_a.sum()), b_ops=int(op_b.sum()), matched_ops=int((op_a & seen_a).sum()),
        ranks_only_a=sorted(ranks_a - ranks_b), ranks_only_b=sorted(ranks_b - ranks_a),
        only_a=np.flatnonzero(~seen_a & (a.kind != Kind.SYNC)), only_b=np.flatnonzero(~seen_b & (b.kind != Kind.SYNC)),
    )


class LabelTable:
    """Label strings interned across graphs, so label ids compare between them."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def of(self, g: Graph) -> np.ndarray:
        """Every node's label id (``op_label``), computed once per distinct (name, kind, bucket, rank)."""
        if not len(g):
            return np.empty(0, np.int64)
        combo = np.stack([g.name, g.kind, g.bucket, g.rank], axis=1).astype(np.int64)
        uniq, first, inverse = np.unique(combo, axis=0, return_index=True, return_inverse=True)
        ids = np.empty(len(uniq), dtype=np.int64)
        for i, v in enumerate(first.tolist()):
            label = op_label(g, v)
            ids[i] = self.ids.setdefault(label, len(self.ids))
            if ids[i] == len(self.names):
                self.names.append(label)
        return ids[inverse.reshape(-1)]


def _keys(g: Graph, labels: LabelTable, layers: dict[str, int]) -> np.ndarray:
    """(n, 8) int64 key rows: rank, step position, kind, label, layer, bucket, bucket bytes, k-th."""
    steps = [int(s) for s in (g.meta.steps or np.unique(g.step[g.step >= 0]).tolist())]
    lut = np.full(max(steps + [0]) + 3, -1, dtype=np.int64)  # step -> position; the closing boundary is len(steps)
    lut[steps] = np.arange(len(steps))
    if steps:
        lut[steps[-1] + 1] = len(steps)
    pos = np.where((g.step >= 0) & (g.step < len(lut)), lut[np.clip(g.step, 0, len(lut) - 1)], -1)
    layer_ids = np.array([layers.setdefault(name, len(layers)) for name in g.layers] + [-1], dtype=np.int64)
    cols = [g.rank, pos, g.kind, labels.of(g), layer_ids[g.layer], g.bucket, _bucket_payload(g)]
    base = np.stack([np.asarray(c, dtype=np.int64) for c in cols], axis=1)
    order = np.lexsort((np.arange(len(g)), g.order, *base.T[::-1]))  # by key, then measured start
    srt = base[order]
    new = np.ones(len(g), dtype=bool)
    new[1:] = (srt[1:] != srt[:-1]).any(axis=1)
    starts = np.flatnonzero(new)
    kth = np.arange(len(g)) - starts[np.cumsum(new) - 1]
    out = np.empty((len(g), 8), dtype=np.int64)
    out[:, :7] = base
    out[order, 7] = kth
    return out


def _bucket_payload(g: Graph) -> np.ndarray:
    """Bytes of the gradient bucket each bucket collective node (issue, join, transfer) serves; 0 elsewhere.

    Read from the transfer the node leads to, since only the transfer carries them in every graph. A sparse gradient's
    bucket gathers the rows its step touched, other bytes each step and run: -1, keyed by its bucket alone."""
    out = np.zeros(len(g), dtype=np.int64)
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.bucket >= 0))
    out[comm] = g.nbytes[comm]
    for kind in (Kind.SYNC, Kind.COMM_ENQUEUE):  # a join feeds its transfer, an issue feeds its join
        for v in np.flatnonzero((g.kind == kind) & (g.bucket >= 0)).tolist():
            nxt = g.successors(v)
            nxt = nxt[(g.bucket[nxt] == g.bucket[v]) & (out[nxt] > 0)]
            out[v] = out[nxt[0]] if len(nxt) else g.nbytes[v]
    out[np.isin(g.kind, _COLLECTIVE) & np.isin(g.bucket, list(sparse_buckets(g)))] = -1
    return out


def first_steps(g: Graph, n: int) -> Graph:
    """``g`` cut to its first ``n`` profiled steps (the next step's boundary markers close them).

    Ops depend only on earlier ones, so the steps kept replay as they did in the whole graph;
    the measured iteration of each rank is re-read from its step markers' measured starts.
    """
    steps = [int(s) for s in g.meta.steps]
    if len(steps) <= n:
        return g
    boundary = steps[n]
    keep = np.isin(g.step, steps[:n]) | ((g.kind == Kind.STEP) & (g.step == boundary))
    b, _ = GraphBuilder.from_graph(g, keep)
    out = b.build()
    marks = {int(r): out.order[(out.kind == Kind.STEP) & (out.rank == r)] for r in out.ranks()}
    out.meta.steps, out.meta.measured_iter_us = steps[:n], {r: float(m.max() - m.min()) / n for r, m in marks.items() if len(m) >= 2}
    return out
