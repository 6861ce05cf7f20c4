"""A rank's events cut into the pieces that become its nodes: ``graph.build``'s first three stages (which events,
flows as instants, pieces); its docstring says the rules.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..traces.comm_kind import P2P_SEND
from ..traces.events import CLOCK_JITTER_US, TIME_RESOLUTION_US, Dep, Kind, LaneKind, RankTrace

_WAIT_RULES = np.array([Dep.SYNC, Dep.COPY, Dep.STAGE, Dep.COMM_WAIT])


# ------------------------------------------------------------------ stage 1: which events
@dataclass(frozen=True, eq=False)
class Selection:
    """Which of a rank's events become graph material.

    ``node``: depth-0 events of the chosen steps, each one or more nodes (pieces) on its lane;
    ``shared``: collective transfers matched to an instance (one node for all ranks);
    ``owner``: per event, the selected depth-0 event around it (itself when selected), -1 none;
    ``spans``: (step, start, end) of the chosen steps; ``main``: the lane that carries the step marks.
    """

    node: np.ndarray
    shared: np.ndarray
    owner: np.ndarray
    spans: np.ndarray
    main: int


def select(trace: RankTrace, steps: list[int], instance: np.ndarray, p2p: tuple[int, ...] = ()) -> Selection:
    """The events of ``steps`` that become nodes, and the transfers that become shared collectives: also a paired
    send/recv's (``p2p``: ``Instance.p2p`` ids) that ran inside the call that issued it (gloo's, on the calling thread)."""
    ev = trace.events
    top = (ev.depth == 0) & (ev.kind != Kind.STEP) & np.isin(ev.step, steps)
    shared = (top & (instance >= 0)) | ((ev.kind == Kind.COMM) & np.isin(instance, np.asarray(p2p, np.int64)) & np.isin(ev.step, steps))
    node = top & ~shared
    spans = trace.step_spans()
    spans = spans[np.isin(spans[:, 0].astype(int), steps)]
    main = next((i for i, lane in enumerate(trace.lanes) if lane.main), 0)
    return Selection(node, shared, _owners(trace, node), spans, main)


# ------------------------------------------------------------------ stage 2: flows as instants
@dataclass(frozen=True, eq=False)
class Anchors:
    """The rank's usable flows as instants on lanes, one row per flow.

    ``src_at``: when, on the source's lane, what the destination needs was done (the source's end;
    for a launch, the call's start). ``dst_at``: where, on the destination's lane, the dependent
    part begins. ``until``: for a wait, the instant it ends (the lane is blocked on
    [``dst_at``, ``until``] and released when ``src_at`` passes); NaN otherwise. An instant less than
    ``TIME_RESOLUTION_US`` from its op's start or end is that start or end (``_on_owner``).
    """

    src: np.ndarray
    dst: np.ndarray
    rule: np.ndarray
    src_at: np.ndarray
    dst_at: np.ndarray
    until: np.ndarray


def anchors(trace: RankTrace, sel: Selection, host_waits: bool = True) -> Anchors:
    """Flows whose both ends are graph material, with the instants their rules join. ``host_waits``: a host thread's waits
    for host transfers, recorded (``Dep.COMM_WAIT``) or not (``_unrecorded_waits``); False where the transfers are matched
    across ranks in issue order only (``graph.build``), so that a shared node may join ranks that never met."""
    ev = trace.events
    f, rule = trace.flows, trace.rules()
    if len(f):
        n = len(ev)
        ok = (f[:, 0] >= 0) & (f[:, 1] >= 0) & (f[:, 0] < n) & (f[:, 1] < n)
        f, rule = f[ok], rule[ok]
        usable = sel.shared | (sel.owner >= 0)
        ok = usable[f[:, 0]] & usable[f[:, 1]]
        f, rule = f[ok], rule[ok]
    if not host_waits:
        f, rule = f[rule != Dep.COMM_WAIT], rule[rule != Dep.COMM_WAIT]
    s, d = (f[:, 0], f[:, 1]) if len(f) else (np.empty(0, np.int64), np.empty(0, np.int64))
    s, d, rule = _released_by_inline(trace, sel, s, d, rule)
    end = ev.end
    src_at = np.where(rule == Dep.LAUNCH, ev.start[s], end[s])
    # a rank joins a shared collective when its transfer starts: what the transfer needed from the
    # source (an enqueue call hands the work over inside the call) was done by then
    src_at = np.where(sel.shared[d], np.minimum(src_at, ev.start[d]), src_at)
    # gloo posts a send inside the call that issues it (``buf->send``), before it makes the work whose "gloo:send" range
    # the trace shows (a caller descheduled in between opened it 10 ms after its peer stage had the data): the sender
    # joined by the call's start
    src_at = np.where(_host_sends(trace, sel)[d] & (rule == Dep.ENQUEUE), np.minimum(src_at, ev.start[s]), src_at)
    until = np.where(rule == Dep.STAGE, np.clip(end[s], ev.start[d], end[d]), end[d])
    bounds = ev.start, np.maximum(end, ev.start)  # as ``pieces`` cuts them
    src_at = _on_owner(src_at, sel.owner[s], *bounds)
    dst_at = _on_owner(ev.start[d].astype(np.float64), sel.owner[d], *bounds)
    until = _on_owner(until, sel.owner[d], *bounds)
    # an empty wait (a call that returned at once, or a drain already done) binds where it stands
    wait = (np.isin(rule, _WAIT_RULES) | ((rule == Dep.AFTER) & (ev.kind[d] == Kind.COMM_WAIT))) & ~sel.shared[d] & (until > dst_at)
    until = np.where(wait, until, np.nan)
    u, v, v_at, v_until = _unrecorded_waits(trace, sel, s, d, rule) if host_waits else (np.empty(0, np.int64),) * 2 + (np.empty(0),) * 2
    return Anchors(np.r_[s, u], np.r_[d, v], np.r_[rule, np.full(len(u), int(Dep.COMM_WAIT), rule.dtype)].astype(np.int16),
                   np.r_[src_at, ev.end[u]], np.r_[dst_at, v_at], np.r_[until, v_until])


def _on_owner(t: np.ndarray, owner: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Instants ``t`` moved onto their owner's (``Selection.owner``; -1: left as they are) ``start`` or ``end``, the
    nearer, where less than ``TIME_RESOLUTION_US`` from it: one instant that float arithmetic split (a transfer the run
    hooks record as starting the nanosecond its call ends reads a fraction of a nanosecond before the call's
    ``start + dur``) would cut the call there and leave a sub-nanosecond piece of it as a node of its own (``pieces``)."""
    o = np.maximum(owner, 0)
    a, z = start[o], end[o]
    to_start, to_end = np.abs(t - a), np.abs(z - t)
    near = (owner >= 0) & (np.minimum(to_start, to_end) < TIME_RESOLUTION_US)
    return np.where(near, np.where(to_end <= to_start, z, a), t)


def _host_sends(trace: RankTrace, sel: Selection) -> np.ndarray:
    """Per event: a shared send run on a host thread (gloo's)."""
    out = np.zeros(len(trace.events), dtype=bool)
    if trace.meta.collectives is not None:
        sends = [e for e, c in zip(trace.meta.collectives.event, trace.meta.collectives.kind) if c in P2P_SEND]
        host = np.array([lane.kind != LaneKind.GPU_STREAM for lane in trace.lanes], dtype=bool)
        out[sends] = sel.shared[sends] & host[trace.events.lane[sends]] if sends else False
    return out


def _released_by_inline(trace: RankTrace, sel: Selection, s: np.ndarray, d: np.ndarray, rule: np.ndarray):
    """The flows plus one from each shared transfer nested in a lane's op (a paired send/recv that blocks its calling
    thread) to the lane's first node starting at or after its end: the thread waited for it there."""
    ev = trace.events
    inline = np.flatnonzero(sel.shared & (ev.depth > 0))
    if not len(inline):
        return s, d, rule
    src, dst = [], []
    for lane in np.unique(ev.lane[inline]).tolist():
        nodes = np.flatnonzero(sel.node & (ev.lane == lane))
        nodes = nodes[np.argsort(ev.start[nodes], kind="stable")]
        mine = inline[ev.lane[inline] == lane]
        at = np.searchsorted(ev.start[nodes], ev.end[mine] - CLOCK_JITTER_US, side="left")
        ok = at < len(nodes)
        src.append(mine[ok])
        dst.append(nodes[at[ok]])
    u, v = np.concatenate(src), np.concatenate(dst)
    return np.r_[s, u], np.r_[d, v], np.r_[rule, np.full(len(u), int(Dep.AFTER), dtype=rule.dtype)]


def _unrecorded_waits(trace: RankTrace, sel: Selection, s: np.ndarray, d: np.ndarray, rule: np.ndarray):
    """Waits for shared host transfers that no recorded op waits for, where the issuing thread blocked on them: nothing of
    it started between its enqueue call's return and the transfer's end. gloo's synchronous collectives (``dist.all_reduce``
    without ``async_op``) and FSDP2's unshard inside ``FSDP::all_gather`` wait in ``Work.wait()``, which the profiler does
    not record: without a flow, a transfer re-priced by a what-if moved nothing (a 2-D FSDP x TP job came out the same
    at 0.1 and 1 Gbit/s). Each becomes a wait in the issuing lane's op around the enqueue, from the call's return to the
    thread's next activity (or that op's end), released by the transfer; a thread idle between ops waits in its next op.
    Returns (transfer, enqueue or next op, dst instant, until: NaN for a next op)."""
    ev = trace.events
    empty = np.empty(0, np.int64)
    host = np.array([lane.kind != LaneKind.GPU_STREAM for lane in trace.lanes], dtype=bool)
    lone = np.flatnonzero(sel.shared & (ev.kind == Kind.COMM) & (ev.depth == 0) & host[ev.lane]) if len(host) else empty
    lone = lone[~np.isin(lone, s[rule != Dep.ENQUEUE])]  # none of its consumers recorded
    enq = {int(t): int(e) for e, t in zip(s[rule == Dep.ENQUEUE].tolist(), d[rule == Dep.ENQUEUE].tolist())}
    end = np.maximum(ev.end, ev.start)
    out: tuple[list, list, list, list] = ([], [], [], [])
    for t in lone.tolist():
        e = enq.get(t, -1)
        if e < 0 or sel.owner[e] < 0 or ev.lane[e] == ev.lane[t]:
            continue
        lane, done = ev.lane[e], end[t] - CLOCK_JITTER_US
        later = np.flatnonzero((ev.lane == lane) & (ev.start > end[e]) & (ev.kind != Kind.STEP))
        resume = float(ev.start[later].min()) if len(later) else np.inf
        if resume < done:  # the thread went on working: not blocked on it
            continue
        o = int(sel.owner[e])
        if end[o] >= done:  # blocked inside the op that issued it (FSDP::all_gather)
            out[0].append(t), out[1].append(e), out[2].append(end[e]), out[3].append(min(resume, end[o]))
        else:  # idle between ops: its next node waits
            nodes = np.flatnonzero(sel.node & (ev.lane == lane) & (ev.start >= done))
            if len(nodes):
                out[0].append(t), out[1].append(int(nodes[np.argmin(ev.start[nodes])])), out[2].append(np.nan), out[3].append(np.nan)
    u, v = np.array(out[0], np.int64), np.array(out[1], np.int64)
    at, until = np.array(out[2], float), np.array(out[3], float)
    at = np.where(np.isnan(at), ev.start[v], at)
    return u, v, at, until


# ------------------------------------------------------------------ stage 3: pieces
@dataclass(frozen=True, eq=False)
class Pieces:
    """The rank's lanes cut into pieces, sorted by (lane, start): each piece becomes one node.

    ``owner``: the depth-0 event a piece is part of (-1 for a step mark); ``mark``: the step a mark
    opens (``max(steps) + 1`` for the closing one), -1 for other pieces; ``wait``: the event a piece
    waits in (-1 none); ``lane_at[l]:lane_at[l+1]`` are lane l's pieces; ``reach``: the running
    maximum of piece ends along each lane (what the lane had done by then).
    """

    lane: np.ndarray
    start: np.ndarray
    end: np.ndarray
    owner: np.ndarray
    mark: np.ndarray
    wait: np.ndarray
    lane_at: np.ndarray
    reach: np.ndarray
    first_of: np.ndarray  # per event: its first piece (-1: it owns none)
    last_of: np.ndarray  # per event: its last piece (-1: it owns none)

    def __len__(self) -> int:
        return len(self.start)

    def progress(self, lane: np.ndarray, t: np.ndarray, owner: np.ndarray) -> np.ndarray:
        """Per query: the piece on ``lane`` that completed what ``owner`` had done by ``t`` (-1 none)."""
        k = np.minimum(self._search(self.reach, "right", lane, t) - 1, self._bounds(owner)[1])
        return np.where(k >= self.lane_at[lane], k, -1)

    def entry(self, lane: np.ndarray, t: np.ndarray, owner: np.ndarray) -> np.ndarray:
        """Per query: the first piece of ``owner`` that starts at or after ``t``."""
        return np.clip(self._search(self.start, "left", lane, t), *self._bounds(owner))

    def release(self, lane: np.ndarray, t: np.ndarray, owner: np.ndarray) -> np.ndarray:
        """Per query: the piece of ``owner`` that ends at ``t`` (where a wait is released)."""
        return np.clip(self._search(self.reach, "left", lane, t), *self._bounds(owner))

    def _search(self, keys: np.ndarray, side: str, lane: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Per query, ``searchsorted`` of ``t`` in ``keys`` within its lane's pieces (global positions)."""
        out = np.empty(len(t), dtype=np.int64)
        for lane_id in np.unique(lane).tolist():
            q = np.flatnonzero(lane == lane_id)
            a, b = self.lane_at[lane_id], self.lane_at[lane_id + 1]
            out[q] = a + np.searchsorted(keys[a:b], t[q], side=side)
        return out

    def _bounds(self, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The first and last piece of each owner."""
        return self.first_of[owner], self.last_of[owner]


def pieces(trace: RankTrace, sel: Selection, anc: Anchors, steps: list[int]) -> Pieces:
    """Cut every selected event at the instants flows join inside it; add the step marks on the main lane."""
    ev = trace.events
    nodes = np.flatnonzero(sel.node)
    end = np.maximum(ev.end, ev.start)
    owner = [nodes, nodes]
    at = [ev.start[nodes], end[nodes]]
    src_in = ~sel.shared[anc.src]
    dst_in = ~sel.shared[anc.dst]
    waits = np.isfinite(anc.until)
    for rows, t in ((anc.src[src_in], anc.src_at[src_in]), (anc.dst[dst_in], anc.dst_at[dst_in]), (anc.dst[waits], anc.until[waits])):
        o = sel.owner[rows]
        inside = (t > ev.start[o]) & (t < end[o])
        owner.append(o[inside])
        at.append(t[inside])
    o, t = np.concatenate(owner), np.concatenate(at)
    rank_of = np.empty(len(ev), dtype=np.int64)  # owners in (lane, start) order
    rank_of[nodes[np.lexsort((ev.start[nodes], ev.lane[nodes]))]] = np.arange(len(nodes))
    order = np.lexsort((t, rank_of[o]))
    o, t = o[order], t[order]
    keep = np.ones(len(o), dtype=bool)
    keep[1:] = (o[1:] != o[:-1]) | (t[1:] != t[:-1])
    o, t = o[keep], t[keep]
    # consecutive boundaries of one owner bound a piece; an owner with a single boundary is one empty piece
    same = np.zeros(len(o), dtype=bool)  # the next boundary is the same owner's
    same[:-1] = o[1:] == o[:-1]
    first = np.ones(len(o), dtype=bool)
    first[1:] = o[1:] != o[:-1]
    alone = ~same & first
    nxt = np.flatnonzero(same) + 1
    p_owner = np.concatenate([o[same], o[alone]])
    p_start = np.concatenate([t[same], t[alone]])
    p_end = np.concatenate([t[nxt], t[alone]])
    # the step marks: each chosen step's start and the closing boundary, on the main lane
    if len(sel.spans):
        m_start = np.r_[sel.spans[:, 1], sel.spans[:, 2].max()]
        m_step = np.r_[sel.spans[:, 0].astype(np.int64), max(steps) + 1]
    else:
        m_start, m_step = np.empty(0), np.empty(0, np.int64)
    lane = np.r_[ev.lane[p_owner], np.full(len(m_start), sel.main)].astype(np.int64)
    start = np.r_[p_start, m_start]
    stop = np.r_[p_end, m_start]
    own = np.r_[p_owner, np.full(len(m_start), -1)]
    mark = np.r_[np.full(len(p_owner), -1), m_step]
    order = np.lexsort((stop, mark < 0, start, lane))  # a mark comes before an op starting with it
    lane, start, stop, own, mark = lane[order], start[order], stop[order], own[order], mark[order]
    lane_at = np.searchsorted(lane, np.arange(len(trace.lanes) + 1), side="left")
    reach = stop.copy()
    for a, b in zip(lane_at[:-1].tolist(), lane_at[1:].tolist()):
        reach[a:b] = np.maximum.accumulate(stop[a:b]) if b > a else reach[a:b]
    real = np.flatnonzero(own >= 0)
    first_of = np.full(len(ev), len(own), dtype=np.int64)  # arrays, not dicts: 16 B per event instead of ~200
    np.minimum.at(first_of, own[real], real)
    first_of[first_of == len(own)] = -1
    last_of = np.full(len(ev), -1, dtype=np.int64)
    np.maximum.at(last_of, own[real], real)
    wait = _mark_waits(lane, start, reach, own, anc, sel, first_of, last_of, lane_at)
    return Pieces(lane, start, stop, own, mark, wait, lane_at, reach, first_of, last_of)


def _mark_waits(lane, start, reach, own, anc: Anchors, sel: Selection, first_of, last_of, lane_at) -> np.ndarray:
    """Per piece, the event it waits in (-1 none): the pieces inside each wait's interval."""
    wait = np.full(len(own), -1, dtype=np.int64)
    rows = np.flatnonzero(np.isfinite(anc.until))
    for r in rows.tolist():
        o = int(sel.owner[anc.dst[r]])
        first, last = int(first_of[o]), int(last_of[o])
        lane_id = int(lane[first])
        a, b = lane_at[lane_id], lane_at[lane_id + 1]
        k0 = max(a + int(np.searchsorted(start[a:b], anc.dst_at[r], side="left")), first)
        k1 = min(a + int(np.searchsorted(reach[a:b], anc.until[r], side="left")), last)
        wait[k0:k1 + 1] = anc.dst[r]
    return wait


def _owners(trace: RankTrace, top: np.ndarray) -> np.ndarray:
    """For every event, the depth-0 event on its lane that encloses it (itself if top), else -1."""
    ev = trace.events
    owner = np.full(len(ev), -1, dtype=np.int64)
    for lane in np.unique(ev.lane):
        on_lane = ev.lane == lane
        tops = np.flatnonzero(top & on_lane)
        if not len(tops):
            continue
        tops = tops[np.argsort(ev.start[tops], kind="stable")]
        members = np.flatnonzero(on_lane)
        k = np.searchsorted(ev.start[tops], ev.start[members], side="right") - 1
        ok = k >= 0
        cand = tops[np.clip(k, 0, None)]
        ok &= ev.start[members] + ev.dur[members] <= ev.start[cand] + ev.dur[cand] + 1e-6
        owner[members[ok]] = cand[ok]
        owner[tops] = tops  # a top owns itself: of two empty ones at one instant the later "enclosed" the earlier
    return owner
