"""A replayed (or measured-and-replayed) graph as a Perfetto timeline: one process per rank."""
from __future__ import annotations

import os

import numpy as np

from ..analysis.critical_path import category
from ..graph.dag import Graph
from ..replay import ReplayResult
from ..traces.events import Kind
from .chrome_trace import Slice, write_chrome_trace


def replay_slices(g: Graph, res: ReplayResult, critical: np.ndarray | None = None) -> list[Slice]:
    on_path = np.zeros(len(g), dtype=bool)
    if critical is not None:
        on_path[critical] = True
    tracks = [(dev.name.split("/", 1)[1] if "/" in dev.name else dev.name) for dev in g.devices]
    cats = [category(k) for k in range(int(g.kind.max()) + 1)] if len(g) else []
    out = []
    v = np.flatnonzero((g.device >= 0) & ((g.dur > 0) | (g.kind == Kind.STEP)))
    cols = (g.device[v], g.rank[v], g.kind[v], g.step[v], g.gap[v], g.nbytes[v], on_path[v], g.name[v], res.start[v], res.end[v] - res.start[v])
    for device, rank, kind, step, gap, nbytes, critical_, name, start, dur in zip(*(c.tolist() for c in cols)):
        process = f"rank {rank}" if rank >= 0 else "collectives"
        args = {"kind": cats[kind], "step": step, "gap_us": round(gap, 3)}
        if nbytes:
            args["bytes"] = nbytes
        if critical_:
            args["critical_path"] = True
        out.append(Slice(process, tracks[device], g.names[name], start, dur, args, cat="critical" if critical_ else args["kind"]))
    return out


def write_replay_trace(path: str | os.PathLike[str], g: Graph, res: ReplayResult, critical: np.ndarray | None = None) -> str:
    return write_chrome_trace(path, replay_slices(g, res, critical), metadata={"producer": "dagprof replay", "engine": res.engine})
