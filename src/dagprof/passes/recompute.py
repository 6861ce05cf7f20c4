"""Activation recomputation (``torch.utils.checkpoint`` around a module), at its measured cost.

A checkpointed module keeps only its input during forward and runs its forward again when
backward reaches it: before the first of its layers' BACKWARD nodes, each rank redoes the
module's FORWARD nodes of that step (their measured durations). ``RecomputeSlots`` puts a
zero-cost node there for every candidate module, so choosing modules only sets durations
(incremental replay, like ``bucket_plan``); ``recompute`` is the plain graph -> graph pass.

Candidates are the non-leaf modules that hold at least two profiled layers (checkpointing a
single leaf frees nothing: it saves its input either way).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..errors import DagprofError
from ..graph.dag import Graph, GraphBuilder
from ..traces.events import Kind
from .buckets import chain_lanes

_BEFORE = 1e-6  # us: a recompute node's order just before the backward it precedes


@dataclass(frozen=True)
class Segment:
    module: str  # module path
    layers: tuple[int, ...]  # graph layer ids of its leaves, in forward order

    def contains(self, other: "Segment") -> bool:
        return other.module.startswith(self.module + ".")


def segments(g: Graph) -> list[Segment]:
    """Candidate modules, outermost first, with their profiled leaves in forward order."""
    fw = np.flatnonzero((g.kind == Kind.FORWARD) & (g.layer >= 0))
    first_seen: dict[int, float] = {}
    for v in fw[np.argsort(g.order[fw], kind="stable")].tolist():
        first_seen.setdefault(int(g.layer[v]), float(g.order[v]))
    members: dict[str, list[int]] = defaultdict(list)
    for lay, name in enumerate(g.layers):
        parts = name.split(".")
        for k in range(1, len(parts)):
            members[".".join(parts[:k])].append(lay)
    out = []
    for mod, lays in members.items():
        lays = sorted((x for x in lays if x in first_seen), key=first_seen.__getitem__)
        if len(lays) >= 2:
            out.append(Segment(mod, tuple(lays)))
    return sorted(out, key=lambda s: (s.module.count("."), first_seen[s.layers[0]]))


class RecomputeSlots:
    """``g`` with a recompute node per (candidate module, step, rank), all free until chosen."""

    def __init__(self, g: Graph, candidates: list[Segment] | None = None):
        self.segments = segments(g) if candidates is None else candidates
        fw = np.flatnonzero((g.kind == Kind.FORWARD) & (g.rank >= 0) & (g.layer >= 0))
        bw = np.flatnonzero((g.kind == Kind.BACKWARD) & (g.rank >= 0) & (g.layer >= 0))
        fw_dur: dict[tuple[int, int, int], float] = defaultdict(float)
        for v in fw.tolist():
            fw_dur[(int(g.step[v]), int(g.rank[v]), int(g.layer[v]))] += float(g.dur[v])
        first_bw: dict[tuple[int, int, int], int] = {}
        for v in bw[np.argsort(g.order[bw], kind="stable")].tolist():
            first_bw.setdefault((int(g.step[v]), int(g.rank[v]), int(g.layer[v])), v)
        keys = sorted({(s, r) for s, r, _ in first_bw})
        b, _ = GraphBuilder.from_graph(g)
        self.nodes: list[np.ndarray] = []  # per segment: its recompute node ids
        self.cost: list[np.ndarray] = []  # per segment: the forward time each node costs when chosen
        for seg in self.segments:
            ids, cost = [], []
            for step, rank in keys:
                heads = [first_bw[(step, rank, lay)] for lay in seg.layers if (step, rank, lay) in first_bw]
                if not heads:
                    continue
                head = min(heads, key=lambda v: g.order[v])
                v = b.add_node(f"rank{rank}.recompute {seg.module}", Kind.FORWARD, rank=rank, device=int(g.device[head]),
                               order=float(g.order[head]) - _BEFORE, step=step)
                b.add_edge(v, head)
                ids.append(v)
                cost.append(sum(fw_dur.get((step, rank, lay), 0.0) for lay in seg.layers))
            self.nodes.append(np.asarray(ids, dtype=np.int64))
            self.cost.append(np.asarray(cost, dtype=float))
        chain_lanes(b)
        self.graph = b.build()

    def index(self, module: str) -> int:
        for i, s in enumerate(self.segments):
            if s.module == module:
                return i
        raise DagprofError(f"no profiled module {module!r} to recompute (candidates: {', '.join(s.module for s in self.segments[:8])}...)")

    def columns(self, chosen: frozenset[int] | set[int]) -> tuple[np.ndarray, np.ndarray]:
        """(recompute node ids, durations) with the ``chosen`` segments priced and the rest free."""
        ids = np.concatenate(self.nodes) if self.nodes else np.empty(0, np.int64)
        dur = np.concatenate([c if i in chosen else np.zeros_like(c) for i, c in enumerate(self.cost)]) if self.cost else np.empty(0)
        return ids, dur


def recompute(g: Graph, modules: list[str]) -> Graph:
    """What if these modules ran under ``torch.utils.checkpoint``?"""
    slots = RecomputeSlots(g)
    chosen = {slots.index(m) for m in modules}
    ids, dur = slots.columns(chosen)
    d = slots.graph.dur.copy()
    d[ids] = dur
    keep = np.ones(len(slots.graph), dtype=bool)
    for i, nodes in enumerate(slots.nodes):
        if i not in chosen:
            keep[nodes] = False
    b, _ = GraphBuilder.from_graph(slots.graph.replace(dur=d), keep)
    chain_lanes(b)
    return b.build()
