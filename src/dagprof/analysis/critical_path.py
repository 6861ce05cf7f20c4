"""The global critical path: the chain of ops (on any rank) that set the makespan.

The replayer records for every node the ``gate``: the predecessor or device release that let it
start, and ``start = end[gate] + gap``. Following gates back from the last node to finish gives a
path whose durations plus gaps add up to the makespan exactly, crossing ranks where a collective
waited for a slower one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph.dag import Graph
from ..replay import ReplayResult
from ..traces.events import Kind

CATEGORY = {
    Kind.FORWARD: "forward",
    Kind.BACKWARD: "backward",
    Kind.UPDATE: "update",
    Kind.COMM: "communication",
    Kind.DATA: "data loading",
    Kind.KERNEL: "other compute",
    Kind.MEMCPY: "memcpy",
}


def category(kind: int) -> str:
    return CATEGORY.get(Kind(int(kind)), "other")


@dataclass
class CriticalPath:
    nodes: np.ndarray  # node ids, first to last
    total_us: float
    by_category: dict[str, float]  # us on the path per category, "framework overhead" = gaps
    top_ops: list[tuple[str, float]]  # (op or layer name, us on the path), largest first
    ranks_crossed: list[int]  # ranks the path visits, in order of first visit

    def to_dict(self, per: float = 1.0) -> dict:
        return {
            "total_ms": self.total_us / per / 1e3,
            "by_category_ms": {k: v / per / 1e3 for k, v in self.by_category.items()},
            "top_ops_ms": [[name, us / per / 1e3] for name, us in self.top_ops],
            "ranks_crossed": self.ranks_crossed,
            "length": int(len(self.nodes)),
        }


def critical_path(g: Graph, res: ReplayResult, top: int = 10) -> CriticalPath:
    if not len(g):
        return CriticalPath(np.empty(0, np.int64), 0.0, {}, [], [])
    path = []
    v = int(np.argmax(res.end))
    while v >= 0:
        path.append(v)
        v = int(res.gate[v])
    nodes = np.array(path[::-1], dtype=np.int64)
    by_cat: dict[str, float] = {}
    per_op: dict[str, float] = {}
    for v in nodes:
        cat = category(g.kind[v])
        by_cat[cat] = by_cat.get(cat, 0.0) + float(g.dur[v])
        by_cat["framework overhead"] = by_cat.get("framework overhead", 0.0) + float(g.gap[v])
        label = _label(g, int(v))
        per_op[label] = per_op.get(label, 0.0) + float(g.dur[v])
    by_cat = {k: v for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1]) if v > 0}
    ops = sorted(((k, v) for k, v in per_op.items() if v > 0), key=lambda kv: -kv[1])[:top]
    seen: list[int] = []
    for r in g.rank[nodes]:
        if r >= 0 and int(r) not in seen:
            seen.append(int(r))
    return CriticalPath(nodes, float(res.end[nodes[-1]]), by_cat, ops, seen)


def _label(g: Graph, v: int) -> str:
    """Group a node with its peers on other ranks and steps: by layer, bucket or op name."""
    kind = category(g.kind[v])
    if g.layer[v] >= 0:
        return f"{kind} {g.layers[g.layer[v]]}"
    if g.kind[v] == Kind.COMM and g.bucket[v] >= 0:  # a parameter server's key, Horovod's fused response, DDP's bucket
        return f"push/pull key {g.bucket[v]}" if g.meta.ps else f"fused all-reduce {g.bucket[v]}" if g.meta.horovod else f"all-reduce bucket {g.bucket[v]}"
    name = g.node_name(v)
    return name.split(".", 1)[1] if name.startswith("rank") and "." in name else name.rsplit(".", 1)[0]
