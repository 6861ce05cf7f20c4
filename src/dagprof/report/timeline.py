"""A replayed (or measured-and-replayed) graph as a Perfetto timeline: one process per rank."""
from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from ..analysis.critical_path import category
from ..graph.dag import Graph
from ..replay import ReplayResult
from ..traces.events import Kind
from .chrome_trace import Slice, rows, write_chrome_trace


def replay_slices(g: Graph, res: ReplayResult, critical: np.ndarray | None = None) -> Iterator[Slice]:
    """One slice per timed node (and step mark), made as the writer takes them (``chrome_trace.rows``)."""
    on_path = np.zeros(len(g), dtype=bool)
    if critical is not None:
        on_path[critical] = True
    tracks = [(dev.name.split("/", 1)[1] if "/" in dev.name else dev.name) for dev in g.devices]
    cats = [category(k) for k in range(int(g.kind.max()) + 1)] if len(g) else []
    v = np.flatnonzero((g.device >= 0) & ((g.dur > 0) | (g.kind == Kind.STEP)))

    def cols(k: np.ndarray) -> tuple[np.ndarray, ...]:
        return (g.device[k], g.rank[k], g.kind[k], g.step[k], g.gap[k], g.nbytes[k], on_path[k], g.name[k], res.start[k],
                res.end[k] - res.start[k])

    for device, rank, kind, step, gap, nbytes, critical_, name, start, dur in rows(v, cols):
        process = f"rank {rank}" if rank >= 0 else "collectives"
        args = {"kind": cats[kind], "step": step, "gap_us": round(gap, 3)}
        if nbytes:
            args["bytes"] = nbytes
        if critical_:
            args["critical_path"] = True
        yield Slice(process, tracks[device], g.names[name], start, dur, args, cat="critical" if critical_ else args["kind"])


def write_replay_trace(path: str | os.PathLike[str], g: Graph, res: ReplayResult, critical: np.ndarray | None = None) -> str:
    return write_chrome_trace(path, replay_slices(g, res, critical), metadata={"producer": "dagprof replay", "engine": res.engine})
