"""Communication broken down by mesh dimension (DP, TP, PP, EP/CP, unknown): what each kind of parallelism costs.

The labels come from ``traces.parallelism`` (graph.meta.parallel, the graph's ``dim`` column); a graph
without labels (a parameter server, the S-SGD model) is data parallel throughout.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph.dag import Graph
from ..replay import ReplayResult
from ..traces.events import Kind
from ..traces.parallelism import Dim
from ..units import MB


@dataclass(frozen=True)
class DimComm:
    """One dimension's collectives, summed over the profiled steps."""

    dim: Dim
    groups: list[str]
    collectives: int
    nbytes: int
    replayed_us: float  # the collectives' replayed durations (shared transfer nodes)

    def to_dict(self, per: int = 1) -> dict:
        return {"dim": self.dim.text, "groups": self.groups, "collectives_per_iter": self.collectives / per,
                "mb_per_iter": self.nbytes / per / MB, "ms_per_iter": self.replayed_us / per / 1e3}


def comm_by_dim(g: Graph, result: ReplayResult) -> list[DimComm]:
    """One row per dimension that has collectives, DP first."""
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    dims = g.dim[comm] if g.meta.parallel is not None else np.full(len(comm), int(Dim.DP), dtype=np.int8)
    rows = []
    for d in sorted(set(dims.tolist()), key=lambda d: (d == Dim.UNKNOWN, d)):
        mine = comm[dims == d]
        groups = sorted({g.devices[int(v)].name.removeprefix("group ") for v in g.device[mine] if v >= 0})
        rows.append(DimComm(Dim(d), groups, len(mine), int(g.nbytes[mine].sum()), float((result.end[mine] - result.start[mine]).sum())))
    return rows


def parallelism_dict(g: Graph) -> dict | None:
    """The labelled process groups (name, description, ranks, labels, why), for --json and the report."""
    par = g.meta.parallel
    if par is None:
        return None
    return {"summary": par.describe(), "dp_size": par.dp_size, "notes": par.notes,
            "groups": [{"name": x.name, "desc": x.desc, "ranks": list(x.ranks), "collectives": x.dims, "evidence": x.evidence}
                       for x in par.groups]}
