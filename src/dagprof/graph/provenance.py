"""Where a graph built from a measurement came from, and the invariant that checks its edges.

``build_graph`` records, in ``graph.meta.provenance``, each node's measured interval (on its
rank's clock) and, per edge, the rule that inferred it. That makes one invariant checkable on any
trace: an inferred edge u -> v is false when, measured, v's dependent instant came before u ended
(beyond clock jitter). ``violations`` counts such edges per rule; over a corpus of traces it
points at wrong rules fast, and ``analysis.explain`` uses the same facts to say why a replay
departs from the measurement.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..traces.events import CLOCK_JITTER_US, Dep
from .dag import Graph


class GraphRule(enum.IntEnum):
    """Edges the graph builder adds itself (codes above every ``Dep``)."""

    PROGRAM_ORDER = 32  # consecutive ops of one thread or stream
    WINDOW_START = 33  # the first step mark -> every other lane's first op
    WINDOW_END = 34  # every lane's last op -> the closing step mark
    COLLECTIVE = 35  # a collective's join -> its transfer


def rule_name(code: int) -> str:
    """The name of a rule code: "LAUNCH", "PROGRAM_ORDER", ..."""
    return GraphRule(code).name if code >= 32 else Dep(code).name


@dataclass(frozen=True, eq=False)
class Provenance:
    """Measured facts behind a built graph (arrays indexed by node, or by recorded edge).

    ``mstart`` is when a node's dependent part began (a wait's is its end: what it waited for had
    to end by then); NaN for nodes no single clock measured (a collective shared by ranks).
    ``seen_end`` is u's end as v's rank saw it (a shared collective ends at different instants on
    different clocks).
    """

    mstart: np.ndarray
    mend: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    rule: np.ndarray
    seen_end: np.ndarray

    def lateness(self) -> np.ndarray:
        """Per recorded edge: how long before u ended v began, measured (positive: the edge is contradicted)."""
        return self.seen_end - self.mstart[self.dst]


def provenance(g: Graph) -> Provenance | None:
    """The graph's provenance, or None when the graph was not built from a measurement (or a pass
    changed its nodes since)."""
    p = g.meta.provenance
    return p if isinstance(p, Provenance) and len(p.mstart) == len(g) else None


@dataclass(frozen=True)
class RuleCheck:
    """One rule's edges checked against the measurement."""

    rule: str
    edges: int
    violated: int
    worst_us: float  # largest lateness among the violated, 0 when none

    def to_dict(self) -> dict:
        return {"rule": self.rule, "edges": self.edges, "violated": self.violated, "worst_us": self.worst_us}


def violations(g: Graph, jitter_us: float = CLOCK_JITTER_US) -> list[RuleCheck]:
    """Per rule, how many of its edges the measured timeline contradicts (v began before u ended)."""
    p = provenance(g)
    if p is None:
        return []
    late = p.lateness()
    measured = np.isfinite(late)
    out = []
    for code in np.unique(p.rule).tolist():
        mine = (p.rule == code) & measured
        bad = mine & (late > jitter_us)
        out.append(RuleCheck(rule_name(code), int(mine.sum()), int(bad.sum()), float(late[bad].max()) if bad.any() else 0.0))
    return out
