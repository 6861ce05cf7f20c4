"""Attribution by replay: how much of B's iteration change each kind of op explains.

Start from A's graph and give it B's measured times for one category of matched ops at a time
(then for one layer, bucket, op or rank at a time within the largest categories); the change of
the replayed iteration is that part's share. The parts need not add up: ops overlap, and a
slower op on one rank may only shorten another's wait. What remains is reported, never hidden:
- interaction = (A with every matched op at B's times) - A - sum of the category parts;
- structure = B - (A with every matched op at B's times): what B's other buckets, ranks or
  ops do that no timing of A's graph can;
so parts + interaction + structure = replayed B - replayed A exactly.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...errors import DagprofError
from ...graph.dag import Graph
from ...replay import IncrementalReplayer, replay
from ...traces.events import Kind
from ..breakdown import job_iteration_us
from ..critical_path import ps_key
from .match import LabelTable, OpMatch

TOP_GROUPS = 6  # layers/buckets/ops/ranks replayed one at a time per category; the rest go together


class Category(str, enum.Enum):
    """What an op's time is spent on, as a person tuning training would group it."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    COMMUNICATION = "communication"
    DATA = "data"
    OVERHEAD = "framework overhead"  # glue between ops, launch and wake-up gaps, host waits
    OTHER_COMPUTE = "other compute"


_OF_KIND = {
    Kind.FORWARD: Category.FORWARD, Kind.BACKWARD: Category.BACKWARD, Kind.UPDATE: Category.OPTIMIZER,
    Kind.COMM: Category.COMMUNICATION, Kind.COMM_ENQUEUE: Category.COMMUNICATION, Kind.DATA: Category.DATA,
    Kind.MEMCPY: Category.DATA, Kind.KERNEL: Category.OTHER_COMPUTE,
}


def category_of(kind: int) -> Category:
    return _OF_KIND.get(Kind(int(kind)), Category.OVERHEAD)


def categories(g: Graph) -> np.ndarray:
    """Category index (into ``list(Category)``) of every node."""
    lut = np.array([list(Category).index(category_of(k)) for k in Kind], dtype=np.int8)
    return lut[g.kind]


@dataclass
class Part:
    """One group of matched ops given B's times on A's graph."""

    label: str
    delta_us: float  # change of the replayed job iteration (us per iteration)
    op_delta_us: float  # the group's own op time change per iteration (rank ops averaged over ranks)
    ops: int  # matched ops in the group whose time changed
    breakdown_by: str = ""  # "layer", "bucket", "op" or "" (not broken down)
    breakdown: list["Part"] = field(default_factory=list)  # one group at a time
    by_rank: list["Part"] = field(default_factory=list)

    @property
    def interaction_us(self) -> float | None:
        """What the one-at-a-time breakdown does not add up to."""
        return self.delta_us - sum(p.delta_us for p in self.breakdown) if self.breakdown else None

    def to_dict(self) -> dict:
        out = {"label": self.label, "delta_ms": self.delta_us / 1e3, "op_delta_ms": self.op_delta_us / 1e3, "ops": self.ops}
        if self.breakdown:
            out |= {"breakdown_by": self.breakdown_by, "breakdown": [p.to_dict() for p in self.breakdown],
                    "breakdown_interaction_ms": self.interaction_us / 1e3}
        if self.by_rank:
            out["by_rank"] = [p.to_dict() for p in self.by_rank]
        return out


@dataclass
class Attribution:
    base_us: float  # A replayed
    target_us: float  # B replayed
    all_matched_us: float  # A with every matched op at B's times, replayed
    parts: list[Part]  # one per category with a change, largest |delta| first

    @property
    def delta_us(self) -> float:
        return self.target_us - self.base_us

    @property
    def interaction_us(self) -> float:
        return self.all_matched_us - self.base_us - sum(p.delta_us for p in self.parts)

    @property
    def structure_us(self) -> float:
        return self.target_us - self.all_matched_us

    def to_dict(self) -> dict:
        return {"parts": [p.to_dict() for p in self.parts], "interaction_ms": self.interaction_us / 1e3,
                "structure_ms": self.structure_us / 1e3, "replayed_delta_ms": self.delta_us / 1e3}


class _Iteration:
    """The job iteration of variants of one graph; incremental replay where numba is usable."""

    def __init__(self, g: Graph) -> None:
        try:
            self._inc: IncrementalReplayer | None = IncrementalReplayer(g)
        except DagprofError:
            self._inc = None

    def __call__(self, g: Graph) -> float:
        res = self._inc.update(g, copy=False) if self._inc is not None else replay(g)
        return job_iteration_us(g, res)


def attribute(a: Graph, b: Graph, m: OpMatch, base_us: float, target_us: float, drill: int = 2) -> Attribution:
    """Parts per category (largest ``drill`` broken down by layer/bucket/op and by rank)."""
    pa, pb = m.pairs[:, 0], m.pairs[:, 1]
    d_dur = b.dur[pb] - a.dur[pa]
    d_gap = b.gap[pb] - a.gap[pa]
    cats = categories(a)[pa]
    overhead = list(Category).index(Category.OVERHEAD)
    steps = max(len(a.meta.steps), 1)
    ranks = max(len(a.ranks()), 1)
    weight = np.where(a.rank[pa] >= 0, 1.0 / ranks, 1.0) / steps  # per iteration, rank ops averaged over ranks
    iteration = _Iteration(a)

    def part(label: str, dur_sel: np.ndarray, gap_sel: np.ndarray) -> Part:
        dur, gap = a.dur.copy(), a.gap.copy()
        dur[pa[dur_sel]] = b.dur[pb[dur_sel]]
        gap[pa[gap_sel]] = b.gap[pb[gap_sel]]
        changed = (dur_sel & (d_dur != 0)) | (gap_sel & (d_gap != 0))
        op = float((weight * (np.where(dur_sel, d_dur, 0.0) + np.where(gap_sel, d_gap, 0.0))).sum())
        t = iteration(a.replace(dur=dur, gap=gap)) if changed.any() else base_us
        return Part(label, t - base_us, op, int(changed.sum()))

    parts = []
    for ci, cat in enumerate(Category):
        dur_sel = cats == ci
        gap_sel = np.ones(len(pa), bool) if ci == overhead else np.zeros(len(pa), bool)
        p = part(cat.value, dur_sel, gap_sel)
        if p.ops:
            parts.append((p, dur_sel, gap_sel))
    parts.sort(key=lambda x: -abs(x[0].delta_us))
    rank_key = np.array([f"rank {r}" if r >= 0 else "shared transfers" for r in a.rank[pa].tolist()], dtype=object)
    for p, dur_sel, gap_sel in parts[:drill]:
        changed = (dur_sel & (d_dur != 0)) | (gap_sel & (d_gap != 0))
        op_delta = weight * (d_dur * dur_sel + d_gap * gap_sel)

        def within(label: str, sel: np.ndarray, dur_sel=dur_sel, gap_sel=gap_sel) -> Part:
            return part(label, dur_sel & sel, gap_sel & sel)

        p.breakdown_by, key = _dimension(a, pa, changed, p.label)
        p.breakdown = _groups(key, changed, within, op_delta, p.breakdown_by)
        if ranks > 1:
            p.by_rank = _groups(rank_key, changed, within, op_delta, "rank")
    if len(pa):
        everything = part("all matched ops", np.ones(len(pa), bool), np.ones(len(pa), bool))
        all_matched = base_us + everything.delta_us
    else:
        all_matched = base_us
    return Attribution(base_us, target_us, all_matched, [p for p, _, _ in parts])


def _dimension(a: Graph, pa: np.ndarray, changed: np.ndarray, category: str) -> tuple[str, np.ndarray]:
    """How to break a category down: by bucket (communication), by layer (where ops have one), else by op."""
    nodes = pa[changed]
    if category == Category.COMMUNICATION.value and (a.bucket[nodes] >= 0).any() and a.meta.ps:  # a parameter server's keys
        return "key", np.array([ps_key(a, x).removeprefix("push/pull ") if x >= 0 else "no key" for x in a.bucket[pa].tolist()], dtype=object)
    if category == Category.COMMUNICATION.value and (a.bucket[nodes] >= 0).any():
        return "bucket", np.array([f"bucket {x}" if x >= 0 else "no bucket" for x in a.bucket[pa].tolist()], dtype=object)
    if len(nodes) and (a.layer[nodes] >= 0).mean() >= 0.5:
        return "layer", np.array([a.layers[x] if x >= 0 else "no layer" for x in a.layer[pa].tolist()], dtype=object)
    table = LabelTable()
    ids = table.of(a)[pa]
    return "op", np.array(table.names, dtype=object)[ids]


def _groups(key: np.ndarray, changed: np.ndarray, part: Callable[[str, np.ndarray], Part], op_delta: np.ndarray, dim: str) -> list[Part]:
    """The ``TOP_GROUPS`` groups whose op time changed most, one at a time, then the rest together."""
    if not changed.any():
        return []
    labels, inverse = np.unique(key[changed].astype(str), return_inverse=True)
    size = np.abs(np.bincount(inverse, weights=op_delta[changed], minlength=len(labels)))
    top = [str(labels[i]) for i in np.argsort(-size, kind="stable")[:TOP_GROUPS]]
    out = [part(lab, key == lab) for lab in top]
    rest = np.isin(key.astype(str), labels) & ~np.isin(key.astype(str), top)
    if rest.any():
        n = len(labels) - len(top)
        out.append(part(f"{n} other {dim}{'s' if n > 1 else ''}", rest))
    return sorted(out, key=lambda p: -abs(p.delta_us))
