"""Collectives across ranks: each instance (matched across ranks by ``align.matching``) becomes one shared ``COMM`` node
on its process group's channel behind a ``SYNC`` join of every rank's ready point.

It starts only once every participant entered it, so waiting for a slower rank emerges in the replay. It is timed on
the shared (aligned) clock, by what each rank measured (``CollectiveEnd``):
- a rank has joined by its transfer's start at the latest: an enqueue call hands the work to a
  worker thread inside the call and may return after the transfer started (or ended), so a flow
  into a collective binds at the earlier of its source instant and the transfer's start;
- the exchange completes once, when the first rank sees it complete: the earliest transfer end,
  or earlier where something waiting for it on that rank was released first (a worker thread
  closes its span after waking the waiter). Other ranks see it later (exit lag: a descheduled
  thread, a socket wake-up; 2-4 ms under load, up to tens) and keep that lag as their own
  overhead: their successors' gaps are measured from the first completion, not their own;
- the channel serves one collective at a time, in the order their SYNCs release them; each runs
  from the later of its SYNC and the previous completion: overhead (gap) until the last rank's
  transfer start, then the exchange (duration) until its completion. So the replay of the measured
  configuration ends each collective where it completed, also where gloo's two worker threads run
  two at once on the link or hook spans include queueing (``meta.comm_lanes`` says whether they
  overlapped); one that completed before its predecessor (gloo's second worker overtook the
  first) costs nothing;
- a rooted collective (broadcast, reduce, send/recv: not in ``align.clocks.SYMMETRIC``) may release
  a rank before every rank joined (gloo's broadcast hands a receiver its data once the root sent it,
  so with 3 ranks one receiver can be done before the other joined): a rank whose completion precedes
  the last join waits instead on its own join of the ranks that had joined by then;
- a broadcast whose root the trace names (ZeRO's overlapped step: ``roots``) completes when its receivers have the data:
  the root's own completion says only that its sends were handed to the socket (on the testbed at 1 Gbit/s the root of
  2.3 MB was done 0.9 ms after it issued the broadcast, the receiver 19 ms later); released at it, as a rank released
  early, the root keeps that time as measured, and the exchange is the receivers';
- a collective that only one loaded rank took part in (a single-rank trace of a larger job) keeps
  its measured duration: it includes waiting for peers nobody recorded.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..traces.events import CLOCK_JITTER_US, Kind
from .assemble import Assembler, CollectiveEnd
from .dag import DeviceKind
from .measured import GraphRule


@dataclass(frozen=True, eq=False)
class _SharedView:
    """One collective instance on the shared clock (us), per participating rank (in ``CollectiveEnd`` order):
    ``shift`` from the rank's clock, ``ready`` (its ready point), ``join`` (its transfer's start),
    ``done`` (when it saw the collective complete)."""

    shift: np.ndarray
    ready: np.ndarray
    join: np.ndarray
    done: np.ndarray


def add_collectives(asm: Assembler, rooted: frozenset[int] = frozenset(), receiver: dict[int, int] | None = None,
                    roots: dict[int, int] | None = None, nbytes: dict[int, int] | None = None) -> None:
    """One SYNC join and one COMM node per instance, timed on the shared (aligned) clock (see the
    module docstring); ``rooted``: instances of collectives that may release a rank before every
    rank joined (broadcast, reduce, send/recv: ``align.clocks.SYMMETRIC`` names the others); ``roots``: a broadcast's
    root rank, where the trace names it, released at its own completion; ``receiver``:
    a send/recv pair's receiving rank, never released before its sender joined. Its recv may seem to end
    before the send started where the clocks' fit is off (stages share no symmetric collective to align them
    on; under load 30 on 2 cores a recv ended 2 ms before its send started): released early, the recv's
    whole wait for the other stage was a fixed gap again, a bubble no what-if moved. (gloo's sender joins at its
    c10d::send call's start, where it posts the data: ``graph.pieces.anchors``; its "gloo:send" range may open
    milliseconds later, after the receiver had the data, on one host's clock too.) ``nbytes``: the bytes of an
    instance that only its root's record tells (``align.matching.ROOT_SIZED``), else the first rank's."""
    receiver, roots, nbytes = receiver or {}, roots or {}, nbytes or {}
    if not asm.instances:
        return
    ref = min(c.base_ns for ends in asm.instances.values() for c in ends)
    views = {k: _view(asm, ends, ref) for k, ends in asm.instances.items()}
    spread = {k: _ready_spread(asm.instances[k], view) for k, view in views.items()}  # before later joins move the ready points
    _after_collectives(asm, views)
    done: dict[str, float] = {}  # channel -> when its previous collective completed (shared clock)
    released: list[tuple[int, int]] = []  # (instance, rank position) released before the last join
    comm_of: dict[int, int] = {}  # instance -> its COMM node
    syncs: list[tuple[int, int, list[CollectiveEnd]]] = []  # (instance, a node that joins its ranks, those ranks' views)
    links: list[tuple[int, int, int, float]] = []  # (u, v, rule, seen), added at once
    for inst in sorted(views, key=lambda k: (views[k].ready.max(), views[k].done.min())):
        ends, view = asm.instances[inst], views[inst]
        head = ends[0]
        channel = asm.b.device(f"group {head.group}", DeviceKind.COMM)
        asm.comm_lanes = max(asm.comm_lanes, max(c.lanes for c in ends))
        alone = len({c.rank for c in ends}) == 1  # no peer recorded: its measured span is all we know
        at = (head.start, head.end) if alone else (np.nan, np.nan)  # measured on one clock, or on none
        sync = asm.node(f"sync.{head.name}.{inst}", Kind.SYNC, at[0], at[0], dur=0.0, order=0.0, step=head.step, bucket=head.bucket,
                        role=head.role, comm_kind=head.comm_kind)
        asm.fixed_gap[sync] = 0.0
        early = view.done < view.join.max() - CLOCK_JITTER_US if inst in rooted and not alone else np.zeros(len(ends), dtype=bool)
        early &= np.array([c.rank != receiver.get(inst, -1) for c in ends], dtype=bool)
        if inst in roots and not alone:  # the root's sends were handed over: the receivers' completion ends the exchange
            root = np.array([c.rank == roots[inst] for c in ends], dtype=bool)
            if root.any() and not root.all():
                early |= root & (view.done < view.done[~root].min())
        if alone:
            c = head
            free = max(view.ready[0] - view.shift[0], c.prev_end_group)
            dur, gap = c.end - max(c.start, free), max(0.0, c.start - free)  # queued behind the previous one: from its end
            seen = [c.end]
        else:
            first = float(view.done[~early].min())
            dur, gap, done[head.group] = _shared_timing(float(view.ready.max()), done.get(head.group, -np.inf), float(view.join.max()), first)
            seen = (first - view.shift).tolist()  # the completion on each rank's clock
            released += [(inst, p) for p in np.flatnonzero(early).tolist()]
        dim = head.dim if all(c.dim == head.dim for c in ends) else 0  # ranks that disagree: unknown
        comm = asm.node(f"{head.name}.{inst}", Kind.COMM, *at, dur=dur, order=0.0, device=channel, step=head.step, bucket=head.bucket,
                         nbytes=nbytes.get(inst, head.nbytes), dim=dim, role=head.role,
                         comm_kind=head.comm_kind, ready_spread=spread[inst])
        asm.fixed_gap[comm] = gap
        comm_of[inst] = comm
        syncs.append((inst, sync, ends))
        links.append((sync, comm, GraphRule.COLLECTIVE, np.nan))
        for p, (c, t) in enumerate(zip(ends, seen)):
            links += [(u, sync, rule, np.nan) for u, rule in c.ready]
            if not early[p]:
                links += [(comm, v, rule, t) for v, rule in c.needs]
    for inst, p in released:
        syncs.append((inst, _release_early(asm, inst, p, views[inst], links), [asm.instances[inst][p]]))
    # a rank that ran this collective straight after another (nothing of its own between them) joined it once it saw the
    # other complete: without the edge, its SYNC had no predecessor and the replay ran it at once, ahead of the ops before it
    order = {inst: k for k, inst in enumerate(comm_of)}
    links += [(comm_of[a], sync, rule, np.nan) for inst, sync, ends in syncs for c in ends for a, rule in c.after
              if order.get(a, len(order)) < order[inst]]
    u, v, rule, seen = zip(*links)
    asm.edges(np.array(u), np.array(v), np.array(rule), np.array(seen))


def _release_early(asm: Assembler, inst: int, p: int, view: _SharedView, links: list[tuple[int, int, int, float]]) -> int:
    """Rank ``p`` completed ``inst`` before the last rank joined (a broadcast's receiver gets its data
    once the root sent it): it waited only for the ranks that had joined by then. Its own join of
    those, released at its completion; the transfer's time is in the join's gap. Its links go into ``links``."""
    ends = asm.instances[inst]
    c = ends[p]
    needed = [q for q in range(len(ends)) if view.join[q] <= view.done[p] + CLOCK_JITTER_US and ends[q].ready]
    join = asm.node(f"rank{c.rank} sync.{c.name}.{inst}", Kind.SYNC, np.nan, np.nan, dur=0.0, order=0.0, step=c.step, bucket=c.bucket,
                    role=c.role, comm_kind=c.comm_kind)
    asm.fixed_gap[join] = max(0.0, float(view.done[p] - max((view.ready[q] for q in needed), default=view.done[p])))
    seen = float(view.done[p] - view.shift[p])
    links += [(u, join, rule, np.nan) for q in needed for u, rule in ends[q].ready] + [(join, v, rule, seen) for v, rule in c.needs]
    return join


def _after_collectives(asm: Assembler, views: dict[int, _SharedView]) -> None:
    """A rank whose join of a collective waited on collectives before it (``CollectiveEnd.after``) was ready once it saw
    them complete: the first completion of each on the shared clock, so that its lag after it is the join's overhead."""
    for inst, view in views.items():
        for p, c in enumerate(asm.instances[inst]):
            seen = [float(views[a].done.min()) for a, _ in c.after if a in views and a != inst]
            if seen:
                view.ready[p] = max(seen) if not c.ready else max(view.ready[p], *seen)


def _ready_spread(ends: list[CollectiveEnd], view: _SharedView) -> float:
    """us between the first and the last rank's measured ready point (each rank's latest op into it, on the shared clock),
    over the ranks that had one; NaN where fewer than two ranks had: a chained join shows no spread. The link fit leaves
    out a JAX collective whose ranks became ready further apart than its own time (``passes.link_fit.joined_together``)."""
    own = [p for p, c in enumerate(ends) if c.ready]
    if len({ends[p].rank for p in own}) < 2:
        return float("nan")
    ready = view.ready[own]
    return float(ready.max() - ready.min())


def _view(asm: Assembler, ends: list[CollectiveEnd], ref_ns: int) -> _SharedView:
    shift = np.array([(c.base_ns - ref_ns) / 1e3 for c in ends])
    ready = np.array([max((asm.mend[u] for u, _ in c.ready), default=c.start) for c in ends]) + shift
    join = np.array([c.start for c in ends]) + shift
    return _SharedView(shift, ready, join, np.array([_completion(asm, c) for c in ends]) + shift)


def _completion(asm: Assembler, c: CollectiveEnd) -> float:
    """When the rank saw the collective complete: its transfer's end, or earlier where something
    that needed the result went ahead before it (a worker thread records its span's end only after
    it woke the waiting thread, and may be descheduled in between)."""
    waited = min((asm.mstart[v] for v, _ in c.needs if np.isfinite(asm.mstart[v])), default=c.end)
    return max(c.start, min(c.end, waited))


def _shared_timing(ready: float, channel_free: float, joined: float, first_end: float) -> tuple[float, float, float]:
    """(dur, gap, end on the shared clock) of a collective several ranks recorded.

    ``ready``: when the last rank was ready (its SYNC); ``channel_free``: the previous completion on
    its channel; ``joined``: the last rank's transfer start; ``first_end``: the first completion.
    The exchange runs from the later of the last join and the channel's previous completion to the
    first completion; the join's lag after the SYNC is overhead (gap). A completion before the join
    or the SYNC (clock residual, a root that finished before a receiver's span began) costs nothing.
    """
    base = max(ready, channel_free)
    gap = min(max(joined - base, 0.0), max(first_end - base, 0.0))
    dur = max(first_end - base - gap, 0.0)
    return dur, gap, base + gap + dur
