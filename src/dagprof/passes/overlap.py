"""Compute slowed by the communication beside it (Echo's overlap slowdown), on a replayed timeline.

On CPU-only jobs the network stack and the collectives' threads use the cores that compute: an
op that overlaps in-flight collectives for a fraction f of its time takes (1 + s * f) times its
undisturbed duration, with s measured on the job's cluster (``collect.measure.overlap``: beside an
all-reduce at the link's rate; ``dagprof calibrate --overlap`` measures it on its own ranks). What a collective
costs the cores is what gloo copies and reduces, so each counts in f in proportion to the bytes it moves
per second against that measured all-reduce (``comm_demand``, at most 1): a bucket at the link's rate
counts whole, PowerSGD's small factors on a channel mostly busy with the hook's own compute (already
charged to the backward) hardly at all. A profile's durations already include the slowdown of the overlap
it had, so a what-if first removes that (``undisturbed``: durations over 1 + s * f of the profiled
timeline, f the op's mean over its steps), then charges the overlap of the new timeline (``disturbed``); one replay in between gives f.
Two replays per candidate instead of one.
"""
from __future__ import annotations

import numpy as np

from ..graph.dag import Graph
from ..graph.replay_result import ReplayResult
from ..traces.events import Kind

SLOWED = (Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE, Kind.OTHER, Kind.KERNEL)


def core_bound_slowdown(g: Graph) -> float:
    """The most compute can slow beside a rank's own in-flight collective from sharing its host's cores, in the model's
    units (``s``: wholly overlapped, (1 + s) times as long), for a profile that measured none (an FSDP job's collectives
    block its ranks: none of its compute ran beside one). Each rank then runs two busy threads, its compute and gloo's;
    R ranks on C cores give each thread C / 2R of a core where R ranks alone had C / max(R, C) of one (the profile's
    own sharing): s = 2R / max(R, C) - 1, 0 where the threads fit the cores; the most over the profile's hosts (2 ranks
    on 2 cores: 1, half speed). R and C are those of ranks that may share cores (``GraphMeta.core_groups``: ranks pinned
    apart each to a core of its own give R = 1, C = 1: its two threads still share it). Where the profile does not record
    its hosts' cores, the most that gives: 1."""
    if not g.meta.host_cpus:
        return 1.0
    return max(max(0.0, 2.0 * k.ranks / max(k.ranks, k.cores, 1) - 1.0) for h in g.meta.host_cpus for k in g.meta.core_groups(h))


def slowed_nodes(g: Graph) -> np.ndarray:
    return np.flatnonzero((g.rank >= 0) & np.isin(g.kind, [int(k) for k in SLOWED]))


def comm_demand(g: Graph, res: ReplayResult, wire: np.ndarray, bytes_per_s: float) -> np.ndarray:
    """Per node of ``g``: how much of the measured collective's CPU a collective takes, as the bytes it moves per
    second of its replayed time (``wire``: bytes on the wire per node) over the rate of the all-reduce the slowdown
    was measured beside, at most 1. gloo's threads copy and reduce what travels: a bucket sent at the link's rate
    takes what the measurement took; a latency-bound one, or PowerSGD's small factors, far less."""
    span = np.maximum(res.end - res.start, 1e-9)
    return np.clip(wire / span * 1e6 / bytes_per_s, 0.0, 1.0)


def comm_overlap(g: Graph, res: ReplayResult, nodes: np.ndarray, demand: np.ndarray | None = None) -> np.ndarray:
    """Per node: the fraction of its [start, end] during which some collective was in flight (``res``: a replay of
    ``g``), each collective weighted by ``demand`` (``comm_demand``; None: each whole), their sum at most 1."""
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.dur > 0))
    return busy_share(res, comm, nodes, None if demand is None else demand[comm])


def busy_share(res: ReplayResult, busy: np.ndarray, nodes: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """Per node of ``nodes``: the fraction of its replayed [start, end] during which some node of ``busy`` ran, each
    weighted by ``weight`` (None: each whole), their sum at most 1."""
    if not len(busy) or not len(nodes):
        return np.zeros(len(nodes))
    d = np.ones(len(busy)) if weight is None else weight
    t = np.r_[res.start[busy], res.end[busy]]
    step = np.r_[d, -d]
    order = np.argsort(t, kind="stable")
    t, level = t[order], np.clip(np.cumsum(step[order]), 0.0, 1.0)  # the demand from each event time to the next
    acc = np.r_[0.0, np.cumsum(level[:-1] * np.diff(t))]  # weighted busy time up to each event time

    a, b = res.start[nodes], res.end[nodes]
    span = np.maximum(b - a, 1e-9)
    return np.clip((np.interp(b, t, acc) - np.interp(a, t, acc)) / span, 0.0, 1.0)


def slowed_comm(g: Graph, res: ReplayResult, slowdown: float) -> np.ndarray:
    """Durations of ``g`` with each collective (1 + ``slowdown`` * f) as long, f the share of its replayed span (``res``)
    during which some rank computed: a collective whose transfer is the ranks' own CPU work (gloo copying and summing over
    a host's loopback) waits for a core beside the compute, which a sweep timed alone never shows. Any rank computing
    counts whole: a ring runs at its slowest rank's pace."""
    dur = g.dur.copy()
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.dur > 0))
    if slowdown > 0 and len(comm):
        dur[comm] *= 1.0 + slowdown * busy_share(res, slowed_nodes(g), comm)
    return dur


def same_op(g: Graph, nodes: np.ndarray) -> np.ndarray:
    """Per node of ``nodes``: an id shared by the instances of one op across the profiled steps (the same rank and name,
    the k-th of that name in its step by profiled order); -1 outside steps, or where the steps hold different numbers
    of that name (the k-th would not be the same op)."""
    out = np.full(len(nodes), -1, dtype=np.int64)
    inside = np.flatnonzero(g.step[nodes] >= 0)
    if not len(inside):
        return out
    sub = nodes[inside]
    o = np.lexsort((g.order[sub], g.step[sub], g.name[sub], g.rank[sub]))
    keys = np.stack([g.rank[sub][o], g.name[sub][o], g.step[sub][o]], axis=1).astype(np.int64)
    first = np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)]
    starts = np.flatnonzero(first)
    per_step = np.diff(np.r_[starts, len(o)])  # instances of each (rank, name) in each step
    occ = np.arange(len(o)) - np.repeat(starts, per_step)
    op, op_of_step = np.unique(keys[starts, :2], axis=0, return_inverse=True)
    lo, hi = np.full(len(op), per_step.max()), np.zeros(len(op), dtype=np.int64)
    np.minimum.at(lo, op_of_step.ravel(), per_step)
    np.maximum.at(hi, op_of_step.ravel(), per_step)
    op_id = np.repeat(op_of_step.ravel(), per_step)
    ids = op_id * (int(per_step.max()) + 1) + occ
    ok = (lo == hi)[op_id]
    out[inside[o[ok]]] = ids[ok]
    return out


def undisturbed(g: Graph, res: ReplayResult, slowdown: float, demand: np.ndarray | None = None) -> np.ndarray:
    """Durations of ``g`` with the slowdown of its own replayed overlap removed: each instance of an op (``same_op``)
    over that op's mean factor 1 + s * f across its profiled steps. The op's own overlap is taken out, not each
    step's: on the optimizer's kept quiet runs the backward steps the replay overlapped most were the fastest, and
    dividing each by its own overlap carried that into every candidate. Each step keeps its own noise (a neighbour's
    load that stalled one op of one rank), so a candidate replayed step by step has the steps the job had and its
    median step (``analysis.interval.typical_iteration_us``) is what the job's measurement takes: a mean per op
    spreads one stalled step over all of them (12 held-out rounds' defaults under load 20-36: 7.8 % from their measured
    median step as the median miss, 11 of 12 under, against 4.0 % with each step kept and its median priced)."""
    dur = g.dur.copy()
    if slowdown > 0:
        nodes = slowed_nodes(g)
        factor = 1.0 + slowdown * comm_overlap(g, res, nodes, demand)
        op = same_op(g, nodes)
        pooled = op >= 0
        _, group = np.unique(op[pooled], return_inverse=True)
        factor[pooled] = (np.bincount(group, weights=factor[pooled]) / np.bincount(group))[group]
        dur[nodes] = g.dur[nodes] / factor
    return dur


def disturbed(g: Graph, base_dur: np.ndarray, res: ReplayResult, slowdown: float, demand: np.ndarray | None = None) -> np.ndarray:
    """``base_dur`` (undisturbed) slowed by the overlap of ``res``, a replay of ``g``."""
    dur = g.dur.copy()
    nodes = slowed_nodes(g)
    dur[nodes] = base_dur[nodes] * (1.0 + slowdown * comm_overlap(g, res, nodes, demand))
    return dur
