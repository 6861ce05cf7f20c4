"""The record of what a graph built from a measurement came from: each edge's rule, each node's measured interval.

``GraphMeta.provenance`` carries it, ``provenance`` checks it against the graph; it sits below both.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from ..traces.events import Dep


class GraphRule(enum.IntEnum):
    """Edges the graph builder adds itself (codes above every ``Dep``)."""

    PROGRAM_ORDER = 32  # consecutive ops of one thread or stream
    WINDOW_START = 33  # the first step mark -> every other lane's first op
    WINDOW_END = 34  # every lane's last op -> the closing step mark
    COLLECTIVE = 35  # a collective's join -> its transfer
    STEP_START = 36  # a step's mark -> a pool thread's first op of that step
    NEGOTIATION = 37  # every rank's Horovod requests of a cycle -> its negotiation's join -> the negotiation (``graph.build``)


def rule_name(code: int) -> str:
    """The name of a rule code: "LAUNCH", "PROGRAM_ORDER", ..."""
    return GraphRule(code).name if code >= 32 else Dep(code).name


@dataclass(frozen=True, eq=False)
class Provenance:
    """Measured facts behind a built graph (arrays indexed by node, or by recorded edge).

    ``mstart`` is when a node's dependent part began (a wait's is its end: what it waited for had
    to end by then); NaN for nodes no single clock measured (a collective shared by ranks).
    ``seen_end`` is u's end as v's rank saw it (a shared collective ends at different instants on
    different clocks). ``clock_us``: rank -> what to add to its times to put them on the shared
    (aligned) clock, whose origin is the earliest rank's.
    """

    mstart: np.ndarray
    mend: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    rule: np.ndarray
    seen_end: np.ndarray
    clock_us: dict[int, float] = field(default_factory=dict)

    def lateness(self) -> np.ndarray:
        """Per recorded edge: how long before u ended v began, measured (positive: the edge is contradicted)."""
        return self.seen_end - self.mstart[self.dst]
