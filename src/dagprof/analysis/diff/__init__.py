"""Two profiles of the same training, compared: what changed, and why, by replay.

``diff_profiles(a, b)`` (or ``diff_analyses`` on two ``Analysis`` objects) matches the ops of the
two runs (``match``), compares per-iteration times measured and replayed, op time per category,
waits for stragglers and both critical paths, lists the ops that changed most, and attributes the
replayed change to categories, layers, buckets and ranks (``attribution``).
``categories_vs_expected(predicted_graph, measured)`` runs the same comparison between what a
model predicted for a change and the profile measured after it: which categories the model got
wrong (the optimizer's ``--verify``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ...errors import DagprofError
from ...graph.dag import Graph
from ...traces.events import Kind
from .. import Analysis, analyze
from ..critical_path import CriticalPath
from .attribution import Attribution, Category, Part, attribute, categories, category_of
from .layout import DataParallelLayout, layout_notes, layout_of
from .match import LabelTable, OpMatch, first_steps, match_ops

MIN_MATCH = 0.5  # below this share of ops with a counterpart, two profiles are not of the same training
BALANCE_PCT = 2.0  # parts, structure and replay within this share of the iteration: the attribution adds up


class HasAnalysis(Protocol):
    """What ``diff_profiles`` needs of a profile: ``pipeline.Profiled`` is one."""

    analysis: Analysis


@dataclass
class RunSide:
    """One side of a comparison, over the steps compared."""

    label: str  # "A", "B", "expected", "measured"
    source: str
    ranks: list[int]
    steps: list[int]
    steps_profiled: int
    measured_us: float | None  # None for a predicted graph
    replayed_us: float
    op_time_us: dict[str, float]  # per category and iteration; rank ops averaged over ranks
    comm_in_flight_us: float  # per iteration, mean over ranks (replayed)
    exposed_comm_us: float
    straggler_wait_us: float  # mean over ranks
    straggler_wait_max_us: float  # the rank that waits most
    layout: DataParallelLayout  # its buckets or FSDP units, as run
    path_us: dict[str, float]  # the critical path per iteration, by the same categories (gaps: framework overhead)
    analysis: Analysis = field(repr=False)

    @property
    def path(self) -> CriticalPath:
        return self.analysis.path

    @property
    def bucket_bytes(self) -> list[int]:
        """Gradient buckets of one step, in bucket order."""
        return list(self.layout.bucket_bytes)

    def to_dict(self) -> dict:
        n = max(len(self.steps), 1)
        return {
            "label": self.label, "source": self.source, "ranks": self.ranks, "steps": self.steps, "steps_profiled": self.steps_profiled,
            "measured_iter_ms": None if self.measured_us is None else self.measured_us / 1e3, "replayed_iter_ms": self.replayed_us / 1e3,
            "op_time_ms": {k: v / 1e3 for k, v in self.op_time_us.items()}, "comm_in_flight_ms": self.comm_in_flight_us / 1e3,
            "exposed_comm_ms": self.exposed_comm_us / 1e3, "straggler_wait_ms": self.straggler_wait_us / 1e3,
            "straggler_wait_max_ms": self.straggler_wait_max_us / 1e3, "bucket_bytes": self.bucket_bytes,
            "data_parallel": self.layout.to_dict(),
            "per_rank": [b.to_dict(per=n) for b in self.analysis.ranks],
            "critical_path_per_iter": self.path.to_dict(per=n) | {"by_category_ms": {k: v / 1e3 for k, v in self.path_us.items()}},
        }


@dataclass
class OpChange:
    """A matched op (summed over steps, one rank or the shared transfers), A against B."""

    rank: int  # -1: a collective's shared transfer
    label: str
    category: str
    a_us: float  # per iteration
    b_us: float

    @property
    def delta_us(self) -> float:
        return self.b_us - self.a_us

    def to_dict(self) -> dict:
        return {"rank": self.rank, "op": self.label, "category": self.category, "a_ms": float(self.a_us) / 1e3,
                "b_ms": float(self.b_us) / 1e3, "delta_ms": float(self.delta_us) / 1e3}


@dataclass
class Unmatched:
    """Ops of one side without a counterpart on the other, grouped by name."""

    side: str
    label: str
    category: str
    count: int
    us_per_iter: float  # rank ops averaged over ranks

    def to_dict(self) -> dict:
        return {"side": self.side, "op": self.label, "category": self.category, "count": self.count, "ms_per_iter": float(self.us_per_iter) / 1e3}


@dataclass
class ProfileDiff:
    a: RunSide
    b: RunSide
    match: OpMatch = field(repr=False)
    attribution: Attribution
    top_ops: list[OpChange]
    unmatched: list[Unmatched]
    notes: list[str]  # what differs in structure, and how the runs were lined up

    @property
    def measured_delta_us(self) -> float | None:
        if self.a.measured_us is None or self.b.measured_us is None:
            return None
        return self.b.measured_us - self.a.measured_us

    @property
    def replayed_delta_us(self) -> float:
        return self.attribution.delta_us

    @property
    def replay_residual_us(self) -> float | None:
        """Measured change the replays do not reproduce (B's replay error minus A's)."""
        m = self.measured_delta_us
        return None if m is None else m - self.replayed_delta_us

    @property
    def unexplained_pct(self) -> float:
        """Interaction plus replay residual, in % of the longer (replayed) iteration: what no single part accounts for."""
        rest = abs(self.attribution.interaction_us) + abs(self.replay_residual_us or 0.0)
        return 100.0 * rest / max(self.a.replayed_us, self.b.replayed_us)

    @property
    def adds_up(self) -> bool:
        return self.unexplained_pct <= BALANCE_PCT

    def category_rows(self) -> list[tuple[str, float, float]]:
        """(row, A us, B us) per iteration: op time per category, then the replayed communication and waits."""
        rows = [(c.value, self.a.op_time_us.get(c.value, 0.0), self.b.op_time_us.get(c.value, 0.0)) for c in Category]
        rows = [r for r in rows if r[1] or r[2]]
        return rows + [
            ("communication in flight (replayed)", self.a.comm_in_flight_us, self.b.comm_in_flight_us),
            ("exposed communication (replayed)", self.a.exposed_comm_us, self.b.exposed_comm_us),
            ("waits for stragglers (replayed)", self.a.straggler_wait_us, self.b.straggler_wait_us),
            ("  on the rank that waits most", self.a.straggler_wait_max_us, self.b.straggler_wait_max_us),
        ] + [("  at the job's own collectives", own(self.a), own(self.b))] * bool(own(self.a) or own(self.b))

    def to_dict(self) -> dict:
        m = self.match
        return {
            "a": self.a.to_dict(), "b": self.b.to_dict(),
            "match": {"a_ops": m.a_ops, "b_ops": m.b_ops, "matched_ops": m.matched_ops, "matched_pct_a": 100 * m.fraction_a,
                      "matched_pct_b": 100 * m.fraction_b, "ranks_only_a": m.ranks_only_a, "ranks_only_b": m.ranks_only_b,
                      "unmatched": [u.to_dict() for u in self.unmatched]},
            "measured_delta_ms": None if self.measured_delta_us is None else self.measured_delta_us / 1e3,
            "replayed_delta_ms": self.replayed_delta_us / 1e3,
            "replay_residual_ms": None if self.replay_residual_us is None else self.replay_residual_us / 1e3,
            "unexplained_pct": self.unexplained_pct, "adds_up": self.adds_up,
            "categories_ms": [{"category": c, "a_ms": x / 1e3, "b_ms": y / 1e3, "delta_ms": (y - x) / 1e3} for c, x, y in self.category_rows()],
            "attribution": self.attribution.to_dict(),
            "top_ops": [o.to_dict() for o in self.top_ops],
            "notes": self.notes,
        }


def diff_profiles(a: HasAnalysis, b: HasAnalysis, **options) -> ProfileDiff:
    """Compare two profiles (``pipeline.Profiled``) of the same training; see ``diff_analyses``."""
    return diff_analyses(a.analysis, b.analysis, **options)


def diff_analyses(a: Analysis, b: Analysis, labels: tuple[str, str] = ("A", "B"), a_measured: bool = True,
                  top: int = 10, drill: int = 2, min_match: float = MIN_MATCH) -> ProfileDiff:
    """Match, compare and attribute ``b`` against ``a``.

    Both are cut to the number of steps they have in common (step k of A is compared with step k
    of B). ``a_measured=False`` for a predicted graph, whose meta still carries the measured times
    of the profile it was derived from. Raises ``DagprofError`` (one line) when fewer than
    ``min_match`` of the ops of the ranks both have match: they are not the same training.
    """
    na, nb = len(a.graph.meta.steps), len(b.graph.meta.steps)
    if not na or not nb:
        raise DagprofError(f"{labels[0] if not na else labels[1]} has no profiled steps to compare")
    notes = []
    n = min(na, nb)
    if na != nb:
        notes.append(f"{labels[0]} has {na} profiled steps and {labels[1]} {nb}: compared over the first {n} of each")
    a_cut, b_cut = _cut(a, n), _cut(b, n)
    m = match_ops(a_cut.graph, b_cut.graph)
    _check_same_training(m, a_cut.graph, b_cut.graph, labels, min_match, (a_cut.measured_us, b_cut.measured_us))
    side_a = _side(labels[0], a_cut, na, a_measured)
    side_b = _side(labels[1], b_cut, nb, True)
    attribution = attribute(a_cut.graph, b_cut.graph, m, side_a.replayed_us, side_b.replayed_us, drill=drill)
    unmatched = _unmatched(labels[0], a_cut.graph, m.only_a) + _unmatched(labels[1], b_cut.graph, m.only_b)
    notes += _structure_notes(side_a, side_b, m, unmatched)
    return ProfileDiff(side_a, side_b, m, attribution, _top_ops(a_cut.graph, b_cut.graph, m, top), unmatched, notes)


@dataclass
class ExpectationCheck:
    """A measured profile against the graph a model predicted for it."""

    diff: ProfileDiff  # A = the prediction, B = the measured run
    threshold_pct: float

    @property
    def expected_us(self) -> float:
        return self.diff.a.replayed_us

    @property
    def measured_us(self) -> float | None:
        return self.diff.b.measured_us

    @property
    def differing(self) -> list[Part]:
        """Category parts (and "structure") that moved the iteration by more than ``threshold_pct`` of it."""
        limit = self.threshold_pct / 100.0 * self.expected_us
        att = self.diff.attribution
        out = [p for p in att.parts if abs(p.delta_us) >= limit]
        if abs(att.structure_us) >= limit:
            out.append(Part("structure", att.structure_us, 0.0, len(self.diff.match.only_a) + len(self.diff.match.only_b)))
        return sorted(out, key=lambda p: -abs(p.delta_us))

    def lines(self) -> list[str]:
        """Plain words: measured against expected, then each category that differed."""
        d = self.diff
        head = f"measured {_ms(self.measured_us)}/iter, the model expected {_ms(self.expected_us)}"
        if self.measured_us is not None:
            head += f" ({100.0 * (self.measured_us - self.expected_us) / self.expected_us:+.1f} %)"
        out = [head + f"; replay of the measured profile: {_ms(d.b.replayed_us)}"]
        for p in self.differing:
            if p.label == "structure":
                out.append(f"  structure: {p.delta_us / 1e3:+.2f} ms on the iteration ({'; '.join(d.notes) or 'ops without a counterpart'})")
            else:
                a, b = d.a.op_time_us.get(p.label, 0.0), d.b.op_time_us.get(p.label, 0.0)
                out.append(f"  {p.label}: {p.delta_us / 1e3:+.2f} ms on the iteration (op time {b / 1e3:.2f} ms measured vs {a / 1e3:.2f} ms expected)")
        if len(out) == 1:
            out.append(f"  every category within {self.threshold_pct:g} % of the iteration of the model's expectation")
        return out

    def to_dict(self) -> dict:
        return {"expected_iter_ms": self.expected_us / 1e3, "measured_iter_ms": None if self.measured_us is None else self.measured_us / 1e3,
                "differing": [p.to_dict() for p in self.differing], "lines": self.lines(), "diff": self.diff.to_dict()}


def categories_vs_expected(expected: Graph | Analysis, measured: HasAnalysis | Analysis, threshold_pct: float = BALANCE_PCT,
                           **options) -> ExpectationCheck:
    """Which categories of a measured profile differ from a model's prediction for it.

    ``expected``: the predicted graph (e.g. ``passes.set_buckets(before.graph, cap)``) or its analysis;
    ``measured``: the profile taken after applying the change (``pipeline.Profiled``) or its analysis.
    """
    exp = expected if isinstance(expected, Analysis) else analyze(expected)
    meas = measured if isinstance(measured, Analysis) else measured.analysis
    d = diff_analyses(exp, meas, labels=("expected", "measured"), a_measured=False, **options)
    return ExpectationCheck(d, threshold_pct)


# -- helpers ---------------------------------------------------------------

def _cut(a: Analysis, n: int) -> Analysis:
    g = first_steps(a.graph, n)
    return a if g is a.graph else analyze(g)


def _check_same_training(m: OpMatch, a: Graph, b: Graph, labels: tuple[str, str], min_match: float,
                         measured_us: tuple[float | None, float | None] = (None, None)) -> None:
    """Refused where too few ops match, in one line that also says why ops of one training may not match (a JAX ODE
    solver's 6 -> 12 steps ran its loop body twice as often: 32 % of B's ops matched, 2026-12-06) and what each
    iteration measured, the answer the user came for."""
    names = [f"{lab} ({g.meta.source})" if g.meta.source else lab for lab, g in zip(labels, (a, b))]
    if not m.a_ops or not m.b_ops:
        ra, rb = a.ranks().tolist(), b.ranks().tolist()
        raise DagprofError(f"{names[0]} with ranks {ra} and {names[1]} with ranks {rb} share no rank with ops to compare")
    if min(m.fraction_a, m.fraction_b) < min_match:
        raise DagprofError(
            f"{names[0]} and {names[1]} are not profiles of the same training: only {100 * m.fraction_a:.0f} % of "
            f"{labels[0]}'s ops and {100 * m.fraction_b:.0f} % of {labels[1]}'s have a counterpart in the other "
            f"(matched by rank, step, name, layer and bucket; {100 * min_match:.0f} % needed: a change of the ops a step runs, "
            "a loop's trip count, the layers or a compiler's fusion, leaves the rest without a counterpart)"
            + ("" if None in measured_us else f"; measured iterations: {labels[0]} {measured_us[0] / 1e3:.2f} ms, "
               f"{labels[1]} {measured_us[1] / 1e3:.2f} ms"))


def own(side: RunSide) -> float:
    """The waits at a DDP job's own collectives (``breakdown.own_collectives``: barriers, logging and metric all-reduces)
    per iteration, mean over ranks: the part of ``straggler_wait_us`` that one rank's own work before them (a checkpoint
    ahead of a barrier) causes, not a slow rank; a row only where a side has some (``category_rows``)."""
    return float(np.mean([r.own_wait_us for r in side.analysis.ranks])) / max(len(side.steps), 1) if side.analysis.ranks else 0.0


def _side(label: str, a: Analysis, profiled: int, measured: bool) -> RunSide:
    g = a.graph
    steps = max(len(g.meta.steps), 1)
    ranks = a.ranks
    mean = lambda xs: float(np.mean(xs)) / steps if len(xs) else 0.0  # noqa: E731
    return RunSide(
        label=label, source=str(g.meta.source or ""), ranks=[int(r) for r in g.ranks()], steps=list(g.meta.steps),
        steps_profiled=profiled, measured_us=a.measured_us if measured else None, replayed_us=a.predicted_us,
        op_time_us=op_time_per_category(g), comm_in_flight_us=mean([r.comm_us for r in ranks]),
        exposed_comm_us=mean([r.exposed_comm_us for r in ranks]), straggler_wait_us=mean([r.wait_us for r in ranks]),
        straggler_wait_max_us=max((r.wait_us for r in ranks), default=0.0) / steps, layout=layout_of(g),
        path_us=_path_by_category(a), analysis=a,
    )


def _weights(g: Graph) -> np.ndarray:
    """Per node: 1/steps, and 1/ranks on top for rank ops (their sums are per iteration, averaged over ranks)."""
    steps = max(len(g.meta.steps), 1)
    ranks = max(len(g.ranks()), 1)
    return np.where(g.rank >= 0, 1.0 / ranks, 1.0) / steps


def op_time_per_category(g: Graph) -> dict[str, float]:
    """Op time per category and iteration (us), gaps between ops counted as framework overhead."""
    w = _weights(g)
    cats = categories(g)
    per = np.bincount(cats, weights=w * g.dur, minlength=len(Category))
    gaps = float((w * g.gap)[g.kind != Kind.STEP].sum())  # a first step marker's gap is the rank's start offset
    out = {c.value: float(per[i]) for i, c in enumerate(Category)}
    out[Category.OVERHEAD.value] += gaps
    return out


def _path_by_category(a: Analysis) -> dict[str, float]:
    g, nodes = a.graph, a.path.nodes
    dur, gap = a.path.counted or (g.dur[nodes], g.gap[nodes])  # a path cut to the iteration's span: the parts counted
    per = np.bincount(categories(g)[nodes], weights=dur, minlength=len(Category)) / a.steps
    out = {c.value: float(per[i]) for i, c in enumerate(Category)}
    out[Category.OVERHEAD.value] += float(gap.sum()) / a.steps
    return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}


def _top_ops(a: Graph, b: Graph, m: OpMatch, top: int) -> list[OpChange]:
    pairs = m.pairs[~np.isin(a.kind[m.pairs[:, 0]], (Kind.STEP, Kind.SYNC))]
    if not len(pairs) or top <= 0:
        return []
    pa, pb = pairs[:, 0], pairs[:, 1]
    table = LabelTable()
    label = table.of(a)[pa]
    keys, first, inverse = np.unique(np.stack([a.rank[pa].astype(np.int64), label], axis=1), axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    per = 1.0 / max(len(a.meta.steps), 1)  # both sides were cut to the same steps
    sa = np.bincount(inverse, weights=a.dur[pa], minlength=len(keys)) * per
    sb = np.bincount(inverse, weights=b.dur[pb], minlength=len(keys)) * per
    best = np.argsort(-np.abs(sb - sa), kind="stable")[:top]
    return [OpChange(int(keys[i, 0]), table.names[int(keys[i, 1])], category_of(int(a.kind[pa[first[i]]])).value, float(sa[i]), float(sb[i]))
            for i in best]


def _unmatched_ops(g: Graph, nodes: np.ndarray) -> np.ndarray:
    """The unmatched nodes that are ops (glue included, step markers and joins not)."""
    return nodes[~np.isin(g.kind[nodes], (Kind.STEP, Kind.SYNC))]


def _unmatched(side: str, g: Graph, nodes: np.ndarray, top: int = 10) -> list[Unmatched]:
    ops = _unmatched_ops(g, nodes)
    if not len(ops):
        return []
    table = LabelTable()
    labels, first, inverse = np.unique(table.of(g)[ops], return_index=True, return_inverse=True)
    count = np.bincount(inverse, minlength=len(labels))
    us = np.bincount(inverse, weights=(_weights(g) * (g.dur + g.gap))[ops], minlength=len(labels))
    best = np.argsort(-us, kind="stable")[:top]
    return [Unmatched(side, table.names[int(labels[i])], category_of(int(g.kind[ops[first[i]]])).value, int(count[i]), float(us[i])) for i in best]


def _structure_notes(a: RunSide, b: RunSide, m: OpMatch, unmatched: list[Unmatched]) -> list[str]:
    notes = []
    if m.ranks_only_a or m.ranks_only_b:
        notes.append(f"ranks differ: {a.label} has {a.ranks}, {b.label} has {b.ranks}")
    notes += layout_notes(a.layout, b.layout, (a.label, b.label))
    notes += _in_ops_notes(a, b)
    counts = {}
    for side, nodes in ((a, m.only_a), (b, m.only_b)):
        g = side.analysis.graph
        ops = _unmatched_ops(g, nodes)
        in_bucket = np.isin(g.kind[ops], (Kind.COMM, Kind.COMM_ENQUEUE)) & (g.bucket[ops] >= 0)
        counts[side.label] = int((~in_bucket).sum()) if a.bucket_bytes != b.bucket_bytes else len(ops)
    others = [u for u in unmatched if "bucket" not in u.label or a.bucket_bytes == b.bucket_bytes]
    if any(counts.values()) and others:
        big = max(others, key=lambda u: u.us_per_iter)
        notes.append("ops without a counterpart: " + ", ".join(f"{n} of {s}'s" for s, n in counts.items() if n)
                     + f" (largest: {big.label} on {big.side}, {big.count} of them, {big.us_per_iter / 1e3:.2f} ms per iteration)")
    return notes


def _in_ops_notes(a: RunSide, b: RunSide) -> list[str]:
    """The model's own collectives timed inside its ops (``Parallelism.in_ops``): their change, waits included, is in
    the rows of the ops that issued them (forward, backward, a gap's "other"), not in communication. Said with each side's
    count and time a step (a CLIP loss's all-gathers and their backward took 18.9 and 22.9 ms a step in two unchanged runs)."""
    per = [(s.label, s.analysis.graph.meta.parallel) for s in (a, b)]
    if not any(p is not None and p.in_ops[0] for _, p in per):
        return []
    sides = ", ".join(f"{label} {p.in_ops[0]:g} ({p.in_ops[1] / 1e3:.1f} ms)" if p is not None else f"{label} 0" for label, p in per)
    # a DDP model under find_unused_parameters=True all-reduces which parameters got a gradient there, one a step: say so
    # rather than name SyncBatchNorm where it is all there is (bench/ddp_fresh/triplet_metric.py)
    used_map_only = all(p is None or not p.in_ops[0] or (p.ddp_used_map and p.in_ops[0] <= 1) for _, p in per)
    whose = ("DDP's all-reduce of which parameters got a gradient, find_unused_parameters=True" if used_map_only else
             "SyncBatchNorm, a differentiable all_gather, a tensor-parallel layer's all-reduce" +
             (", DDP's find_unused_parameters all-reduce" if any(p is not None and p.ddp_used_map for _, p in per) else ""))
    return [f"collectives a step per rank inside the model's own ops ({sides}; {whose}): "
            "their time and waits are counted in the ops that issued them, not in communication"]


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1e3:.2f} ms"


__all__ = ["ProfileDiff", "RunSide", "OpChange", "Unmatched", "ExpectationCheck", "Attribution", "Part", "Category", "OpMatch",
           "diff_profiles", "diff_analyses", "categories_vs_expected", "match_ops", "op_time_per_category"]
