"""Other processes' CPU on a host's cores over a profiled window: the cores' busy time less the job's own.

A JAX job's ranks beyond their cores wait a scheduler tick a ring step (``passes.ring_pace``); on a loaded host the rings
ran slower (jax68, 2026-12-07: a 4-worker mixer and GAT on 2 cores took 1.22 and 2.19 ms a ring step beside 0.6 and 0.9 of
a core of other work, against the 0.99 priced), and no profile said that load. So each TF/JAX rank records over its
window (``collect.hooks.xplane_window``) the wall time, the time the cores it may run on were neither idle nor in iowait
(``/proc/stat``) and its process's CPU; the host's figure is the busy share less every rank's own, said beside the pace
(``passes.compute.ring_pace_note``; priced on the cores it leaves it moved 4 of 5 cells away: jax69 in evidence).
Not user + nice + system alone (as ``bench_frameworks._others_cpu_pct`` counts the machine's): a process's CPU clock holds
the softirq work done on its threads (its own packets), which ``/proc/stat`` books apart. Over 3 s of a loopback
ping-pong beside other sessions' work (2026-12-07 21:38, ``bench/other_load_probe.py``), against every other process's
utime + stime: 1.317 / 1.340 / 1.323 cores so, 1.326 / 1.353 / 1.317 by the processes, 1.23-1.26 by user + nice + system;
in the first hold of that evening (jax69) the latter read 1.40-1.52 cores busy beside 1.50-1.66 of the ranks' own.
"""
from __future__ import annotations

from typing import Annotated, Iterable

import msgspec

from .run_schema import Count


class WindowCpu(msgspec.Struct, frozen=True):
    """One rank's profiled window, first step's start to last step's end: its wall time, the busy time of the cores its
    affinity set holds (every process's) and its own process's CPU time, ns."""

    wall_ns: Annotated[int, msgspec.Meta(gt=0)]
    cores_busy_ns: Count
    own_cpu_ns: Count


def other_cores(ranks: Iterable[tuple[str, str, WindowCpu | None]]) -> dict[str, float]:
    """Per host (``(host, cpu_set, window)`` of each rank): the cores' worth of CPU other processes took during the window,
    the ranks' mean busy share of their cores less each rank's own share, at least 0. Only hosts where every rank recorded
    its window on one affinity set (ranks pinned apart would each see other cores' busy time)."""
    by_host: dict[str, list[tuple[str, WindowCpu | None]]] = {}
    for host, cpu_set, window in ranks:
        by_host.setdefault(host, []).append((cpu_set, window))
    out = {}
    for host, seen in by_host.items():
        windows = [w for _, w in seen if w is not None]
        if host and len(windows) == len(seen) and len({s for s, _ in seen}) == 1:
            busy = sum(w.cores_busy_ns / w.wall_ns for w in windows) / len(windows)
            out[host] = max(0.0, busy - sum(w.own_cpu_ns / w.wall_ns for w in windows))
    return out
