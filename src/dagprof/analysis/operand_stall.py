"""A JAX all-reduce's per-operand stall on gloo: measured, bounded, not predictable; it widens a link what-if's interval.

XLA's CPU client runs a combined all-reduce as one gloo call per operand (``traces.xla_hlo``). Measured on the
namespace testbed (2026-12-03, ``bench/bench_jax_operands.py``, packet capture and ``strace``): when an operand's
first message arrives before the local side has posted its receive, gloo's device loop thread polls the socket
(``epoll_wait`` returning at once, nothing read) until the thread that posts it runs; on contended cores that thread
waits for the scheduler's tick. Each operand so stalls 0 or about one tick (3.5-3.9 ms gaps between one side's message
and the other's reply, at 40 Mbit/s as on an unshaped loopback, the kernel's ``CONFIG_HZ=250``): 36 operands of 256 B
took 10-160 ms where one array of their bytes took 0.3-8 ms. Which operands stall is a race between the two processes
that moved with the load and the rate (more at a faster link, fewer where an operand's own transfer is long), so
a profile at one rate does not tell the stall at another: between two runs it differs by up to the operands a step
times the tick, either way.

Where it applies follows from the same mechanism: in a collective a rank keeps two threads runnable, the polling device
thread and the one that posts (its Python thread sleeps in ``block_until_ready``), so a host's ranks can contend when
2 x its ranks outnumber the cores they share (``GraphMeta.core_groups``, the collectors' ``sched_getaffinity``);
with a core each, the poster never waits behind a poller. Recordings without their cores (before 2026-12-03) are taken
as contended. The tick is the contended hosts' own (``GraphMeta.host_tick_us``, their kernels' ``CONFIG_HZ``), else
``TICK_US`` assumed. Not seen by the profile: other processes keeping the cores busy (a loaded host contends too, more
than a tick an array: where the profiled steps' collectives ran beyond the wire by more than the bound, the note counts
those steps),
compute XLA runs beside a collective (more threads). Ranks pinned apart contend by the groups whose affinity sets
overlap (``GraphMeta.core_groups``: a rank alone on one core still stalls behind its own poller). Only the contended
side is measured (2 ranks on 2 cores): that a host
with a core per thread does not stall follows from the mechanism, not from a run.

A link row whose change to the step is smaller than the stall moves a step at even odds (``stall_outweighs``) is a point
the profile cannot tell from the profiled run's: jax_gnn_jit's 14 arrays a step (0-56 ms, +-16 ms at even odds) against the
+8 ms that 500 -> 200 Mbit/s adds on the wire. Its collectives do not wait for the peer's issue (the two ranks entered
each all-reduce 0.1-21 ms apart, median 2; the transfer, timed from the later one, took 6-155 ms where the wire's share
was 4.5 ms at 500 Mbit/s), so neither the issue times nor the wire rate tell the rest; four kept jobs at 500 Mbit/s
alone had median steps of 37-80 ms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..graph.dag import Graph
from ..intervals import union
from ..passes.link_fit import priced_comm, priced_world_size
from ..passes.ring_pace import THREADS_PER_RANK, TICK_US
from ..traces.events import Kind

EVEN_ODDS = 0.5  # a row's change is held against the stall's difference between two steps at this level: more likely than not


@dataclass(frozen=True)
class StallRisk:
    """What bounds a JAX-on-gloo job's per-operand stall: its arrays a step, the tick, the hosts that can contend."""

    operands: float  # arrays a step, one gloo call each
    tick_us: float  # the longest tick of the hosts below
    tick_recorded: bool  # their kernels said it (else TICK_US assumed for at least one)
    hosts: tuple[str, ...] | None  # hosts whose ranks' threads outnumber their cores; None: the run did not record its cores

    @property
    def bound_us(self) -> float:
        return self.operands * self.tick_us


def stall_risk(g: Graph) -> StallRisk | None:
    """The stall's terms for ``g``; None where the graph is not an XLA (JAX) job on gloo, its operands were not read, or
    every host has a core for each of its ranks' threads."""
    n = g.meta.collective_operands_per_step
    if g.meta.framework != "jax" or g.meta.backend != "gloo" or not n:
        return None
    cpus, ticks = g.meta.host_cpus, g.meta.host_tick_us
    if sum(k.ranks for k in cpus.values()) < len(g.meta.ranks):  # some rank did not say its cores: as contended
        said = list(ticks.values())
        return StallRisk(n, max(said, default=TICK_US), bool(said), None)
    hosts = tuple(g.meta.crowded_hosts(THREADS_PER_RANK))
    if not hosts:
        return None
    return StallRisk(n, max(ticks.get(h, TICK_US) for h in hosts), all(h in ticks for h in hosts), hosts)


# what a rank's host thread does while it waits (its Python thread in ``block_until_ready``, markers) rather than work
# that holds a core
_WAITING = tuple(int(k) for k in (Kind.COMM, Kind.COMM_WAIT, Kind.COMM_ENQUEUE, Kind.STEP, Kind.SYNC))


@dataclass(frozen=True)
class ThreadShare:
    """How a step's collectives' time splits by what the xplane recorded on the job's host threads meanwhile (medians
    over the profiled steps, us): ``own_us`` while some thread of the job's ranks on the host ran recorded work (XLA's
    kernels on its Eigen and client threads, the Python thread's ops: the job's own threads held cores the posting
    thread may have waited for), ``runtime_us`` while none did (gloo's polling device thread, the runtime's untraced
    threads, the scheduler, other processes). ``wire_us``: the wire's share where the rate is known (``runtime_us`` is
    then what lies beyond it), else None."""

    collective_us: float
    own_us: float
    runtime_us: float
    wire_us: float | None


def thread_share(g: Graph) -> ThreadShare | None:
    """The split of ``ThreadShare`` for a graph whose ranks share one host's cores (several hosts: whose threads contend
    with whose is not in the graph; no host recorded: not known to be one; ranks pinned apart: another rank's threads hold
    none of a poster's cores; None in each case); None where there are no timed collectives."""
    comm = _timed_comm(g)
    if not comm.any() or len(g.meta.host_cpus) != 1 or g.meta.pinned_groups:  # pinned apart: no rank's threads hold another's cores
        return None
    work = np.flatnonzero((g.rank >= 0) & ~np.isin(g.kind, _WAITING) & (g.dur > 0))
    busy = union(g.order[work], g.order[work] + g.dur[work])
    start, end = busy[:, 0], busy[:, 1]
    lo, hi = g.order[comm], g.order[comm] + g.dur[comm]
    covered = np.array([np.clip(np.minimum(end, b) - np.maximum(start, a), 0.0, None).sum() for a, b in zip(lo, hi)])
    steps, inverse = np.unique(g.step[comm], return_inverse=True)
    total = np.bincount(inverse, weights=g.dur[comm], minlength=len(steps))
    own = np.bincount(inverse, weights=covered, minlength=len(steps))
    wire = _on_wire_us(g, comm)
    if wire is not None:
        on_wire = np.bincount(inverse, weights=wire, minlength=len(steps))
        runtime = np.maximum(total - own - on_wire, 0.0)
    else:
        on_wire, runtime = None, total - own
    return ThreadShare(float(np.median(total)), float(np.median(own)), float(np.median(runtime)),
                       None if on_wire is None else float(np.median(on_wire)))


def stall_bound_us(g: Graph) -> float:
    """Most a step's collectives can stall on gloo's per-operand calls (us): the operands a step times the tick; 0 where
    ``stall_risk`` says there is none."""
    risk = stall_risk(g)
    return risk.bound_us if risk else 0.0


def _beyond_wire_per_step(g: Graph) -> np.ndarray | None:
    """Each profiled step's collectives' time beyond the wire they were profiled at (us; ``meta.wire_bytes_per_s``: a
    ring of N moves 2 (N - 1) / N of each one's bytes per link); None where the wire is not known."""
    comm = _timed_comm(g)
    wire = _on_wire_us(g, comm)
    if wire is None or not comm.any():
        return None
    steps, inverse = np.unique(g.step[comm], return_inverse=True)
    return np.bincount(inverse, weights=g.dur[comm] - wire, minlength=len(steps))


def _timed_comm(g: Graph) -> np.ndarray:
    """The profiled steps' timed collectives (a mask)."""
    return priced_comm(g) & (g.dur > 0) & (g.step >= 0)


def _on_wire_us(g: Graph, comm: np.ndarray) -> np.ndarray | None:
    """Each collective of the mask ``comm``'s time on the wire it was profiled at (``meta.wire_bytes_per_s``: a ring of N
    moves 2 (N - 1) / N of its bytes per link); None where the wire is not known."""
    wire = g.meta.wire_bytes_per_s
    if not wire:
        return None
    n = priced_world_size(g)
    return 2 * (n - 1) / n * g.nbytes[comm] / wire * 1e6


def held_us(g: Graph) -> float | None:
    """The most stall a prediction from ``g`` holds (us a step): its collectives' time beyond the wire, the median
    step's; what a step could lose if none of its arrays stalled at the other rate. None where the wire is not known."""
    beyond = _beyond_wire_per_step(g)
    return None if beyond is None else max(float(np.median(beyond)), 0.0)


def stall_halfwidth_us(bound_us: float, level: float) -> float:
    """The ``level`` interval's half-width of the difference between two steps' stalls, each spread evenly over
    [0, ``bound_us``] (as measured): a triangular spread over +-bound, P(|d| > x) = (1 - x / bound)^2."""
    return bound_us * (1.0 - math.sqrt(1.0 - level))


def stall_outweighs(g: Graph, change_us: float) -> str | None:
    """Why a link row's point cannot be told from the profiled run's: it changes the step by ``change_us``, less than
    the stall alone moves one step at even odds (``stall_halfwidth_us`` at ``EVEN_ODDS``); None where it does not (or
    there is no stall)."""
    bound = stall_bound_us(g)
    half = stall_halfwidth_us(bound, EVEN_ODDS)
    if not bound or abs(change_us) >= half:
        return None
    return (f"changes the step by {change_us / 1e3:+.1f} ms, less than gloo's per-array stall (0-{bound / 1e3:.0f} ms a step) "
            f"moves one step at even odds (+-{half / 1e3:.0f} ms): its point is not told apart from the profiled run's, read its interval")


def stall_note(g: Graph) -> str | None:
    """One line for a link what-if of such a job, None where it is not one."""
    risk = stall_risk(g)
    if risk is None:
        return None
    tick = f"{risk.tick_us / 1e3:.3g} ms" + (", the host kernel's" if risk.tick_recorded else " assumed: the profile did not record the host's")
    cores = ("the profile did not record the cores: taken as contended" if risk.hosts is None else
             "; ".join(f"{h}: {g.meta.host_cpus[h].ranks} ranks x {THREADS_PER_RANK} threads on {g.meta.host_cpus[h].cores} cores"
                       + g.meta.pinned_said(h) for h in risk.hosts))
    beyond = _beyond_wire_per_step(g)
    over = beyond[beyond > risk.bound_us] if beyond is not None else np.zeros(0)
    past = (f"; but in {len(over)} of {len(beyond)} profiled steps the collectives ran beyond the wire by more than that (the "
            f"most {over.max() / 1e3:.0f} ms): more than a tick an array, as where other processes keep the cores busy, beyond "
            "what that bound covers") if len(over) else ""
    share = thread_share(g)
    split = "" if share is None else (
        f"; of the collectives' {share.collective_us / 1e3:.1f} ms a step (medians over the window), the job's own host threads "
        f"ran recorded work (XLA's threads, Python's) beside them for {share.own_us / 1e3:.1f} ms, none of them for "
        + (f"{share.runtime_us / 1e3:.1f} ms beyond the wire's {share.wire_us / 1e3:.1f} ms" if share.wire_us is not None
           else f"{share.runtime_us / 1e3:.1f} ms (the wire's share in it not known)")
        + " (gloo's polling thread, the runtime's untraced threads, other processes)")
    return (f"JAX on gloo: {risk.operands:.0f} arrays a step, one gloo call each; each can stall 0 or about one scheduler tick "
            f"({tick}) on contended cores ({cores}), 0-{risk.bound_us / 1e3:.0f} ms a step, at random "
            f"(a race between the processes): not predictable from this profile, the interval of a link what-if holds it{past}{split}")
