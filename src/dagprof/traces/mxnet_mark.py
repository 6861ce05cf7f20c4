"""How an MXNet worker's trace names its worker: ``mx.profiler`` records no worker id, so the collector
(``collect.hooks.mxnet_ps``) marks each trace with an instant marker of its own domain, and the reader (``traces.mxnet``)
refuses a trace whose mark names another worker than the manifest lists it as (traces collected before 2026-12-07 lack it).
Standard library only: the MXNet collector runs under MXNet's Python.
"""
from __future__ import annotations

import re

DOMAIN = "dagprof"
# as MXNet 1.9.1 writes a domain's instant marker: ``{"name": "worker 1", "cat": "dagprof,instant_marker", "ph": "n", ...}``
CATEGORY = f"{DOMAIN},instant_marker"
PATTERN = re.compile(r"worker (\d+)")


def name(rank: int) -> str:
    return f"worker {rank}"
