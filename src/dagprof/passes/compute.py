"""Compute what-ifs: faster or slower per-rank compute (a new GPU, more cores, contention)."""
from __future__ import annotations

import numpy as np

from ..errors import DagprofError
from ..graph.dag import Graph
from ..traces.events import Kind

COMPUTE_KINDS = (Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE, Kind.KERNEL, Kind.OTHER)


def scale_compute(g: Graph, speed: float, kinds: tuple[Kind, ...] = COMPUTE_KINDS) -> Graph:
    """Divide the duration of every per-rank compute node by ``speed`` (2.0 = twice as fast).
    Framework gaps and communication are left as measured."""
    if not speed > 0:
        raise DagprofError(f"compute speed factor must be positive, got {speed}")
    mask = (g.rank >= 0) & np.isin(g.kind, [int(k) for k in kinds])
    dur = g.dur.copy()
    dur[mask] /= speed
    return g.replace(dur=dur)
