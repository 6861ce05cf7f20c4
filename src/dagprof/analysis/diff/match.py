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
from ...traces.events import Kind

_INSTANCE = re.compile(r"\.\d+$")
_COLLECTIVE = (Kind.COMM, Kind.SYNC, Kind.COMM_ENQUEUE)
_GLUE = (Kind.OTHER, Kind.COMM_WAIT, Kind.RUNTIME)
_BUCKET_WORD = {Kind.COMM: "all-reduce", Kind.SYNC: "join", Kind.COMM_ENQUEUE: "issue all-reduce"}


def op_label(g: Graph, v: int) -> str:
    """A node's name as another run of the same job would spell it."""
    kind = int(g.kind[v])
    if kind == Kind.STEP:
        return "step boundary"
    if kind in _COLLECTIVE and g.bucket[v] >= 0:
        return f"{_BUCKET_WORD[Kind(kind)]} bucket {int(g.bucket[v])}"
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
    ka, kb = _keys(a), _keys(b)
    index_b = {k: v for v, k in enumerate(kb)}
    pa, pb = [], []
    for v, k in enumerate(ka):
        w = index_b.get(k)
        if w is not None:
            pa.append(v)
            pb.append(w)
    pairs = np.array([pa, pb], dtype=np.int64).T.reshape(-1, 2)
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


def _keys(g: Graph) -> list[tuple]:
    steps = list(g.meta.get("steps") or np.unique(g.step[g.step >= 0]).tolist())
    pos = {int(s): i for i, s in enumerate(steps)}
    if steps:
        pos[int(steps[-1]) + 1] = len(steps)  # the closing step boundary
    payload = _bucket_payload(g)
    labels: dict[tuple[int, int, int], str] = {}
    count: dict[tuple, int] = {}
    keys: list[tuple] = [()] * len(g)
    for v in np.lexsort((np.arange(len(g)), g.order)).tolist():
        kind, bucket = int(g.kind[v]), int(g.bucket[v])
        cache = (int(g.name[v]), kind, bucket) if g.rank[v] < 0 or kind in _COLLECTIVE or kind == Kind.STEP else None
        label = labels.get(cache) if cache else None
        if label is None:
            label = op_label(g, v)
            if cache:
                labels[cache] = label
        layer = g.layers[g.layer[v]] if g.layer[v] >= 0 else ""
        base = (int(g.rank[v]), pos.get(int(g.step[v]), -1), kind, label, layer, bucket, int(payload[v]))
        k = count.get(base, 0)
        count[base] = k + 1
        keys[v] = base + (k,)
    return keys


def _bucket_payload(g: Graph) -> np.ndarray:
    """Bytes of the gradient bucket each bucket collective node (issue, join, transfer) serves; 0 elsewhere.

    Read from the transfer the node leads to, since only the transfer carries them in every graph."""
    out = np.zeros(len(g), dtype=np.int64)
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.bucket >= 0))
    out[comm] = g.nbytes[comm]
    for kind in (Kind.SYNC, Kind.COMM_ENQUEUE):  # a join feeds its transfer, an issue feeds its join
        for v in np.flatnonzero((g.kind == kind) & (g.bucket >= 0)).tolist():
            nxt = g.successors(v)
            nxt = nxt[(g.bucket[nxt] == g.bucket[v]) & (out[nxt] > 0)]
            out[v] = out[nxt[0]] if len(nxt) else g.nbytes[v]
    return out


def first_steps(g: Graph, n: int) -> Graph:
    """``g`` cut to its first ``n`` profiled steps (the next step's boundary markers close them).

    Ops depend only on earlier ones, so the steps kept replay as they did in the whole graph;
    the measured iteration of each rank is re-read from its step markers' measured starts.
    """
    steps = [int(s) for s in g.meta.get("steps", [])]
    if len(steps) <= n:
        return g
    boundary = steps[n]
    keep = np.isin(g.step, steps[:n]) | ((g.kind == Kind.STEP) & (g.step == boundary))
    b, _ = GraphBuilder.from_graph(g, keep)
    out = b.build()
    marks = {int(r): out.order[(out.kind == Kind.STEP) & (out.rank == r)] for r in out.ranks()}
    out.meta.update(steps=steps[:n], measured_iter_us={r: float(m.max() - m.min()) / n for r, m in marks.items() if len(m) >= 2})
    return out
