"""Compute what-ifs: faster or slower per-rank compute (a new GPU, more cores, contention)."""
from __future__ import annotations

import numpy as np

from ..errors import DagprofError
from ..graph.dag import Device, DeviceKind, Graph
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


def share_cores(g: Graph, cores: int, ranks_per_host: int | None = None) -> Graph:
    """What if ranks shared a host's ``cores`` (more ranks than cores, as on a small machine)?

    Every rank's compute lanes on one host are mapped onto one device of capacity ``cores``:
    a rank still runs its lane in order, but at most ``cores`` ranks compute at once (a FIFO
    stand-in for the OS's time sharing). ``ranks_per_host`` None: all ranks on one host.
    """
    if cores < 1:
        raise DagprofError(f"cores must be >= 1, got {cores}")
    ranks = int(g.world_size)
    per = ranks if ranks_per_host is None else ranks_per_host
    if per < 1:
        raise DagprofError(f"ranks per host must be >= 1, got {per}")
    devices = list(g.devices)
    shared: dict[int, int] = {}
    remap = np.arange(len(devices))
    for i, d in enumerate(g.devices):
        if d.rank >= 0 and d.kind in (DeviceKind.COMPUTE, DeviceKind.HOST):
            host = d.rank // per
            if host not in shared:
                shared[host] = len(devices)
                devices.append(Device(f"host{host}/cpu ({cores} cores)", DeviceKind.COMPUTE, -1, cores))
            remap[i] = shared[host]
    device = np.where(g.device >= 0, remap[np.maximum(g.device, 0)], -1)
    return g.replace(device=device, devices=devices)
