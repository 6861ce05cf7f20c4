"""Where a graph built from a measurement came from, and the invariant that checks its edges.

``build_graph`` records, in ``graph.meta.provenance``, each node's measured interval (on its
rank's clock) and, per edge, the rule that inferred it (the record is ``measured.Provenance``, below
``GraphMeta``, which carries it). That makes one invariant checkable on any
trace: an inferred edge u -> v is false when, measured, v's dependent instant came before u ended
(beyond clock jitter). ``violations`` counts such edges per rule; over a corpus of traces it
points at wrong rules fast, and ``analysis.explain`` uses the same facts to say why a replay
departs from the measurement.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..traces.events import CLOCK_JITTER_US
from .dag import Graph
from .measured import Provenance, rule_name


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
