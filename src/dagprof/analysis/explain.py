"""Where and why a replay departs from the measured timeline.

The replay keeps every op's measured duration and overhead, so on the measured configuration an
op can only start at another time than it did because of an edge: a false one holds it back (it
waits for something it did not wait for), a missing one lets it run early. For each lane this
finds the first ops whose replayed start drifts from the measured one by more than a threshold,
and names what gated each: the edge, the rule that inferred it, and whether the measurement
contradicts it ("measured, it started 3.1 ms before X ended": a false edge).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph.dag import Graph
from ..graph.measured import Provenance, rule_name
from ..graph.provenance import RuleCheck, provenance, violations
from ..replay import ReplayResult
from ..traces.events import CLOCK_JITTER_US, Kind

DEFAULT_THRESHOLD_US = 100.0


@dataclass(frozen=True)
class Departure:
    """An op whose replayed start left its measured start, and what held it (or failed to hold it)."""

    lane: str
    op: str
    node: int
    measured_us: float  # measured start, on the replay's clock (its rank's first step aligned)
    replayed_us: float
    gate: int  # the node whose end let it start (a predecessor, or the op before it on a busy lane); -1 none
    gate_op: str
    gate_lane: str
    rule: str  # the rule of the edge gate -> op; "" when the lane was busy, not an edge
    contradicted_us: float  # measured, how long before the gate ended the op had started (> 0: the edge is false)
    gate_drift_us: float  # how late the gate itself replayed

    @property
    def drift_us(self) -> float:
        return self.replayed_us - self.measured_us

    @property
    def cause(self) -> str:
        if self.gate < 0:
            return "nothing held it back"
        if not self.rule:
            return f"its lane was busy with {self.gate_op}"
        what = f"waits for {self.gate_op} on {self.gate_lane} ({self.rule})"
        if self.contradicted_us > CLOCK_JITTER_US:
            return f"{what}; measured, it started {_t(self.contradicted_us)} before that ended: a false edge"
        if self.drift_us < 0:
            return f"{what}; it ran early: an edge it had is missing"
        return f"{what}, which itself replayed {_t(self.gate_drift_us)} late"

    def to_dict(self) -> dict:
        return {"lane": self.lane, "op": self.op, "node": self.node, "measured_ms": self.measured_us / 1e3,
                "replayed_ms": self.replayed_us / 1e3, "drift_ms": self.drift_us / 1e3, "gate_op": self.gate_op,
                "gate_lane": self.gate_lane, "rule": self.rule, "contradicted_ms": self.contradicted_us / 1e3,
                "false_edge": bool(self.rule) and self.contradicted_us > CLOCK_JITTER_US, "cause": self.cause}



@dataclass(frozen=True)
class Explanation:
    """Departures per lane (first ones first, by measured time) and the per-rule invariant check."""

    threshold_us: float
    departures: list[Departure]
    checks: list[RuleCheck]
    measured: bool = True  # False: the graph keeps no measured time per op (none to depart from)

    @property
    def false_edges(self) -> list[Departure]:
        return [d for d in self.departures if d.rule and d.contradicted_us > CLOCK_JITTER_US]

    def to_dict(self) -> dict:
        return {"threshold_ms": self.threshold_us / 1e3, "departures": [d.to_dict() for d in self.departures],
                "violations": [c.to_dict() for c in self.checks], "measured": self.measured}



def explain(g: Graph, res: ReplayResult, threshold_us: float = DEFAULT_THRESHOLD_US, per_lane: int = 3) -> Explanation:
    """For each lane, the first ``per_lane`` departures: the first op that drifts by more than
    ``threshold_us``, then each later op whose drift moved by that much again."""
    p = provenance(g)
    if p is None:
        return Explanation(threshold_us, [], [], measured=False)
    offset = _clock_offsets(g, res, p)
    measured = p.mstart + offset
    drift = res.start - measured
    out: list[Departure] = []
    has_clock = np.isfinite(measured)
    for dev in np.unique(g.device[(g.device >= 0) & has_clock]).tolist():
        nodes = np.flatnonzero((g.device == dev) & has_clock)
        nodes = nodes[np.argsort(measured[nodes], kind="stable")]
        last, found = 0.0, 0
        for v in nodes.tolist():
            if abs(drift[v] - last) > threshold_us:
                out.append(_departure(g, res, p, measured, drift, v))
                last, found = drift[v], found + 1
                if found == per_lane:
                    break
    out.sort(key=lambda d: d.measured_us)
    return Explanation(threshold_us, out, violations(g))


def _clock_offsets(g: Graph, res: ReplayResult, p: Provenance) -> np.ndarray:
    """Per node: replayed minus measured time of its rank's first step mark (NaN for shared nodes)."""
    offset = np.full(len(g), np.nan)
    for r in g.ranks().tolist():
        marks = np.flatnonzero((g.kind == Kind.STEP) & (g.rank == r))
        if len(marks):
            first = marks[np.argmin(p.mstart[marks])]
            offset[g.rank == r] = res.start[first] - p.mstart[first]
    return offset


def _departure(g: Graph, res: ReplayResult, p: Provenance, measured: np.ndarray, drift: np.ndarray, v: int) -> Departure:
    u = int(res.gate[v])
    rule, late = "", 0.0
    if u >= 0:
        k = np.flatnonzero((p.src == u) & (p.dst == v))
        if len(k):
            rule = rule_name(int(p.rule[k[0]]))
            late = float(p.seen_end[k[0]] - p.mstart[v]) if np.isfinite(p.seen_end[k[0]]) else 0.0
        elif u in g.predecessors(v):
            rule = "edge"
    lane = lambda x: g.devices[g.device[x]].name if g.device[x] >= 0 else "no lane"  # noqa: E731
    return Departure(
        lane=lane(v), op=g.node_name(v), node=v, measured_us=float(measured[v]), replayed_us=float(res.start[v]), gate=u,
        gate_op=g.node_name(u) if u >= 0 else "", gate_lane=lane(u) if u >= 0 else "", rule=rule,
        contradicted_us=late, gate_drift_us=float(drift[u]) if u >= 0 and np.isfinite(drift[u]) else 0.0,
    )


def departure_line(d: dict) -> str:
    """One departure (``Departure.to_dict()``) as a line of text."""
    return f"{d['lane']}: {d['op']} replays {d['drift_ms']:+.3f} ms off (measured at {d['measured_ms']:.3f} ms): {d['cause']}"


def text_lines(e: dict) -> list[str]:
    """An explanation (``Explanation.to_dict()``) as lines of text."""
    lines = [f"where the replay departs from the measurement (ops that drift by more than {e['threshold_ms']:g} ms):"]
    lines += [f"  {departure_line(d)}" for d in e["departures"]] or (
        ["  nowhere: every op replays at its measured start"] if e.get("measured", True) else
        ["  not told: this graph keeps no measured start per op to compare with (a parameter server's job is built so)"])
    bad = [c for c in e["violations"] if c["violated"]]
    if bad:
        lines.append("inferred edges the measured timeline contradicts, per rule:")
        lines += [f"  {c['rule']}: {c['violated']} of {c['edges']} (worst {c['worst_us'] / 1e3:.3f} ms)" for c in bad]
    return lines


def _t(us: float) -> str:
    return f"{us / 1e3:.3f} ms" if abs(us) >= 1000 else f"{us:.1f} us"
