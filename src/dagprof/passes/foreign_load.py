"""Other processes' work on a rank's own core, taken out of the op times (``analysis.foreign_cpu.remove_foreign_load``).

A rank pinned alone to one core (a host of its own) shares it with other processes only when something else runs there:
on the two-host Horovod testbed a busy loop pinned beside rank 1 for a whole ViT job (``bench_frameworks.py --hog``,
2026-12-06, branch hvdload61) held 48 % of its step; its forward ops ran x2.3, its backward x2.1, its enqueue calls x5.8
and the job's collectives x2.0 (153 against 77 ms a step, the wire unchanged): on a host without an accelerator every
thread of the rank (the training thread's ops, Horovod's loop, gloo's) runs on that core, and every collective waits on
its slowest rank's. So a loaded rank's host work, all of it, the coordinator's negotiations with it, and the time beyond the
wire of the collectives of a job that runs them on the host are what the load stretched.
"""
from __future__ import annotations

import numpy as np

from ..graph.dag import Graph
from ..traces.events import CommRole, Kind
from .link_fit import medium_equivalent_bytes, priced_comm, priced_world_size
from .profiler_cost import on_accelerator

_NOT_WORK = (Kind.COMM, Kind.COMM_WAIT, Kind.STEP, Kind.SYNC)  # a rank's waits and marks, and the collectives (priced apart)


def scale_loaded_ranks(g: Graph, factors: dict[int, float]) -> Graph:
    """``g`` with each named rank's host work (its ops but waits and collectives, on no accelerator stream, and its gaps)
    times its factor, and, where ``collectives_scaled``, every collective's time beyond its wire's at the profiled rate times
    the least factor: a collective ends with its slowest rank's part."""
    host = (g.rank >= 0) & ~on_accelerator(g)
    per = np.ones(len(g.dur))
    for r, f in factors.items():
        per[g.rank == r] = f
    work = host & ~np.isin(g.kind, [int(k) for k in _NOT_WORK])
    dur, gap = g.dur.copy(), g.gap.copy()
    dur[work] *= per[work]
    gap[host] *= per[host]
    # Horovod's coordinator (rank 0) agrees each cycle with every rank's background thread: its negotiations end at the
    # slowest rank's pace, though on the coordinator's lane (beside a busy loop on rank 1's core the ViT's rank 0's 17 a step
    # took about 61 ms against 26 quiet, and left as profiled they set the removed model's step: hvdlvl62)
    neg = g.role == int(CommRole.NEGOTIATION)
    dur[neg] = g.dur[neg] * min(factors.values())
    if collectives_scaled(g):
        comm = np.flatnonzero(priced_comm(g) & (g.dur > 0))
        n = max(priced_world_size(g), 2)
        wire = 2 * (n - 1) / n * medium_equivalent_bytes(g, comm, g.meta.half_duplex) * 1e6 / g.meta.wire_bytes_per_s
        dur[comm] = np.minimum(dur[comm], wire) + np.maximum(dur[comm] - wire, 0.0) * min(factors.values())
    return g.replace(dur=dur, gap=gap)


def collectives_scaled(g: Graph) -> bool:
    """Whether ``scale_loaded_ranks`` scales the collectives' time beyond the wire: no rank launches onto an accelerator
    (they are the ranks' threads' CPU work: gloo, Horovod's loop) and the wire the run was profiled at is known
    (``--profiled-bandwidth``). A wire-bound collective is not the cores': beside the same busy loop the ViT's collectives
    (44 small responses a step, ~0.7 of each ~4.4 ms on the wire) ran x2.0, the LSTM's (3 a step, 4.1 MB) x1.26-1.36,
    and scaled whole by the rank's factor (0.49) the LSTM's came out below its wire's time."""
    return not on_accelerator(g).any() and bool(g.meta.wire_bytes_per_s)
