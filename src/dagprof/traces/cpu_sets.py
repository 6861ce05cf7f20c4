"""A rank's affinity set, the core ids it may run on, written compactly as Linux's cpu lists write them (``0-3,8``).

The collectors record it beside the count (``cpus``) so that pinned ranks (``taskset``, mpirun ``--bind-to core``,
numactl) read as what they are: two ranks pinned each to a core of its own on a 2-core host are not two ranks on one
core (``graph.host_cores``). Standard library only: the MXNet collector runs under MXNet's Python.
"""
from __future__ import annotations

import os

PATTERN = r"^(\d+(-\d+)?(,\d+(-\d+)?)*)?$"  # "" where not recorded


def this_process() -> str:
    """The cores this process may run on, as a cpu list; "" where the platform does not say."""
    try:
        return cpu_list(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return ""


def usable_cpus() -> int:
    """How many cores this process may run on (its affinity set; the machine's count where the platform keeps none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


def cpu_list(cores: set[int] | frozenset[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"``."""
    out, ids = [], sorted(cores)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def cores(text: str) -> frozenset[int]:
    """``"0-2,5"`` -> ``{0, 1, 2, 5}`` (the schema's ``PATTERN`` checked it); a range written backwards is empty."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)
