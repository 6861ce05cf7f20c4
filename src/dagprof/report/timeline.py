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
    out = []
    for v in np.flatnonzero((g.device >= 0) & ((g.dur > 0) | (g.kind == Kind.STEP))):
        dev = g.devices[g.device[v]]
        rank = int(g.rank[v])
        process = f"rank {rank}" if rank >= 0 else "collectives"
        track = dev.name.split("/", 1)[1] if "/" in dev.name else dev.name
        args = {"kind": category(g.kind[v]), "step": int(g.step[v]), "gap_us": round(float(g.gap[v]), 3)}
        if g.nbytes[v]:
            args["bytes"] = int(g.nbytes[v])
        if on_path[v]:
            args["critical_path"] = True
        out.append(Slice(process, track, g.node_name(v), float(res.start[v]), float(res.end[v] - res.start[v]), args,
                         cat="critical" if on_path[v] else args["kind"]))
    return out


def write_replay_trace(path: str | os.PathLike[str], g: Graph, res: ReplayResult, critical: np.ndarray | None = None) -> str:
    return write_chrome_trace(path, replay_slices(g, res, critical), metadata={"producer": "dagprof replay", "engine": res.engine})
