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
from ..traces.mxnet import QUANTIZE, pslite_bytes
from ..traces.parallelism import Dim
from ..units import MB

INSIDE_OPS = ("collectives no hook saw, labelled by their process group; their measured transfers on the comm threads, waits "
              "included, are time inside the ops that issued them, not on the critical path's comm lanes")


@dataclass(frozen=True)
class DimComm:
    """One dimension's collectives, summed over the profiled steps."""

    dim: Dim
    groups: list[str]
    collectives: int
    nbytes: int
    replayed_us: float  # the collectives' replayed durations (shared transfer nodes)
    # a dagprof run's collectives no hook saw (``Parallelism.in_op_groups``), per group instance (each rank's summed, over its
    # group's ranks): timed inside the ops that issued them (host time), not on the comm lanes the critical path crosses
    inside_ops: float = 0.0
    inside_us: float = 0.0  # their measured transfers on the comm threads, waits for peers included
    inside_bytes: float = 0.0  # the bytes the collector recorded for their calls (DTensor's functional collectives)
    inside_sized: float = 0.0  # how many of them it recorded
    # of ``collectives``, those over a process group of one rank (HSDP's replicate all-reduces on a 1xS mesh): their bytes
    # cross no link, so ``nbytes`` leaves them out
    alone: int = 0
    alone_bytes: int = 0

    def to_dict(self, per: int = 1) -> dict:
        return {"dim": self.dim.text, "groups": self.groups, "collectives_per_iter": self.collectives / per,
                "mb_per_iter": self.nbytes / per / MB, "ms_per_iter": self.replayed_us / per / 1e3,
                "one_rank_group_per_iter": self.alone / per, "one_rank_group_mb_per_iter": self.alone_bytes / per / MB,
                "inside_ops_per_iter": self.inside_ops / per, "inside_ops_ms_per_iter": self.inside_us / per / 1e3,
                "inside_ops_mb_per_iter": self.inside_bytes / per / MB, "inside_ops_sized_per_iter": self.inside_sized / per}


def comm_by_dim(g: Graph, result: ReplayResult) -> list[DimComm]:
    """One row per dimension that has collectives, DP first."""
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    dims = g.dim[comm] if g.meta.parallel is not None else np.full(len(comm), int(Dim.DP), dtype=np.int8)
    inside: dict[int, list] = {}  # dim -> [group instances, us, bytes, sized, groups]
    for x in g.meta.parallel.in_op_groups if g.meta.parallel is not None else ():
        d = next(k for k in Dim if k.text == x.dim)
        size = len(x.group.split(",")) if x.group else 1
        row = inside.setdefault(int(d), [0.0, 0.0, 0.0, 0.0, set()])
        for k, v in enumerate((x.count, x.us, x.nbytes, x.sized)):
            row[k] += v / size
        row[4].add(x.group or "not told")
    one = {f"group {x.name}" for x in g.meta.parallel.groups if len(x.ranks) == 1} if g.meta.parallel is not None else set()
    alone = np.array([v >= 0 and g.devices[int(v)].name in one for v in g.device[comm]], dtype=bool)
    rows = []
    for d in sorted(set(dims.tolist()) | set(inside), key=lambda d: (d == Dim.UNKNOWN, d)):
        mine, solo = comm[dims == d], alone[dims == d]
        n, us, nbytes, sized, named = inside.get(d, (0.0, 0.0, 0.0, 0.0, set()))
        # the graph's names of its groups (DDP's "0"), else the in-op ones' ranks
        groups = sorted({g.devices[int(v)].name.removeprefix("group ") for v in g.device[mine] if v >= 0} or named)
        rows.append(DimComm(Dim(d), groups, len(mine), int(g.nbytes[mine[~solo]].sum()), float((result.end[mine] - result.start[mine]).sum()),
                            n, us, nbytes, sized, int(solo.sum()), int(g.nbytes[mine[solo]].sum())))
    return rows


def ps_compression(g: Graph, result: ReplayResult) -> dict | None:
    """A parameter-server job's gradient compression (``PsRecord.compression``), for --json and the report: what one
    worker pushes and pulls an iteration (``traces.mxnet.pslite_bytes``) and its quantizing, the push's own work on the
    workers' engines (``QuantizeCPU``, per worker); None where its pushes are not compressed."""
    ps = g.meta.ps
    if ps is None or not ps.compression:
        return None
    steps = max(len(g.meta.steps), 1)
    parts = [p for s in g.meta.steps for k in ps.keys for p in pslite_bytes(ps, k, s, ps.num_servers)]
    quantize = np.flatnonzero(np.isin(g.name, [i for i, n in enumerate(g.names) if n.split(".", 1)[-1] == QUANTIZE]))
    workers = max(g.meta.world_size, 1)
    return {"type": ps.compression, "pushed_mb": sum(p[1] for p in parts) / steps / MB, "pulled_mb": sum(p[2] for p in parts) / steps / MB,
            "quantize_ms": float((result.end[quantize] - result.start[quantize]).sum()) / steps / workers / 1e3}


def parallelism_dict(g: Graph) -> dict | None:
    """The labelled process groups (name, description, ranks, labels, why), and the collectives inside the ops by group
    (summed over ranks and steps), for --json and the report."""
    par = g.meta.parallel
    if par is None:
        return None
    return {"summary": par.describe(), "dp_size": par.dp_size, "notes": par.notes,
            "groups": [{"name": x.name, "desc": x.desc, "ranks": list(x.ranks), "collectives": x.dims, "evidence": x.evidence,
                        "no_gradients": [{"why": n.why.name.lower(), "around": n.around, "collectives": n.count} for n in x.no_gradients]}
                       for x in par.groups],
            "inside_ops": [{"group": x.group, "dim": x.dim, "collectives": x.count, "ms": x.us / 1e3, "mb": x.nbytes / MB, "sized": x.sized}
                           for x in par.in_op_groups]}
