"""Events -> one global dataflow graph over all ranks (dPRO's global DFG).

Rules, all derived from the normalised events (``traces.events`` conventions):
- every depth-0 event of a lane is a node; a lane's nodes form a chain (program order);
- a flow joins two instants its ``Dep`` rule names (a launch: the call's start; most others: the
  source's end); a depth-0 op with such an instant inside is cut there, so a kernel depends on the
  moment of its launch, not on the end of the op around the launch call;
- a host wait (a sync call, a blocking copy, a c10d wait on a host transfer) costs no time of its
  own: it ends when what it waits for ends, and whatever it measured beyond that becomes overhead (gap);
- a collective instance (matched across ranks by ``align.matching``) becomes one shared ``COMM``
  node on its process group's channel behind a ``SYNC`` join of every rank's ready point: it starts
  only once every participant entered it, so waiting for a slower rank emerges in the replay. It is
  timed on the shared (aligned) clock, by what each rank measured:
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
  - a collective that only one loaded rank took part in (a single-rank trace of a larger job) keeps
    its measured duration: it includes waiting for peers nobody recorded;
- each node's ``gap`` is its measured start minus the latest measured end of its predecessors
  (clipped at 0): the framework overhead the replayer adds back (dPRO);
- zero-cost ``STEP`` nodes mark every step boundary on each rank's main lane; each rank's first one
  starts at its measured offset from the earliest rank (clocks aligned beforehand), so the replay
  begins as skewed as the run did; the closing one also follows every lane's last op that ended before it.

``meta.provenance`` keeps each node's measured interval and each edge's rule (``graph.provenance``).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from ..align.clocks import is_symmetric
from ..align.matching import Matching
from ..align.one_clock import on_one_clock
from ..errors import DagprofError
from ..traces.events import CLOCK_JITTER_US, Dep, Kind, LaneKind, RankTrace, Run
from ..traces.parallelism import label_run
from ..traces.step_marks import mark_steps
from ..traces.steps import iteration_us
from .dag import DeviceKind, Graph, GraphBuilder
from .measured import GraphRule, Provenance
from .meta import LoopSteps

_LANE_DEVICE = {LaneKind.CPU_THREAD: DeviceKind.HOST, LaneKind.GPU_STREAM: DeviceKind.COMPUTE, LaneKind.COMM_THREAD: DeviceKind.COMM}
_WAIT_RULES = np.array([Dep.SYNC, Dep.COPY, Dep.STAGE, Dep.COMM_WAIT])


def common_steps(run: Run, steps: range | None = None) -> list[int]:
    """Steps present on every rank (optionally restricted to ``steps``)."""
    per_rank = [set(r.step_spans()[:, 0].astype(int).tolist()) for r in run.ranks]
    if not per_rank or not all(per_rank):
        raise DagprofError("no profiled steps (ProfilerStep markers) found", run.source)
    common = set.intersection(*per_rank)
    if steps is not None:
        if not set(steps) & common:
            raise DagprofError(f"steps {steps.start}..{steps.stop - 1} requested but the trace holds steps {min(common)}..{max(common)}", run.source)
        common &= set(steps)
    if not common:
        raise DagprofError("the ranks share no profiled step", run.source)
    return sorted(common)


def measured_iter_us(trace: RankTrace, steps: list[int]) -> float:
    """Measured iteration time of ``trace`` over ``steps`` (``traces.steps.iteration_us``)."""
    spans = trace.step_spans()
    return iteration_us(spans[np.isin(spans[:, 0].astype(int), steps)])


def loop_steps(run: Run) -> LoopSteps | None:
    """The collector's step times of every rank (``traces.dagprof_run``); None for traces without them."""
    if not all(t.meta.unprofiled_step_times_us is not None for t in run.ranks):
        return None
    return LoopSteps({t.rank: {int(s): float(d) for s, d in t.meta.step_times_us.items()} for t in run.ranks},
                     {t.rank: {int(s): float(d) for s, d in (t.meta.unprofiled_step_times_us or {}).items()} for t in run.ranks})


def build_graph(run: Run, steps: range | None = None, matching: Matching | None = None, step_marker: str | None = None) -> Graph:
    """The global DAG of ``run`` over the steps all ranks profiled, its ranks' clocks aligned first (once).

    ``step_marker`` names the annotation that opens each iteration when the trace has no
    ``ProfilerStep``; without either, the whole profiled window is one iteration (``traces.step_marks``).
    """
    if not run.ranks:
        raise DagprofError("no rank traces to build a graph from", run.source)
    run = mark_steps(run, step_marker)
    run, matching = on_one_clock(run, matching)  # may renumber a rank's steps (profilers started at other iterations)
    chosen = common_steps(run, steps)
    parallel, dims = label_run(run)
    asm = _Assembler()
    p2p = tuple(k for k, it in enumerate(matching.instances) if it.p2p)
    for pos, trace in enumerate(run.ranks):
        inst = np.full(len(trace.events), -1, dtype=np.int64)
        inst[: len(matching.instance[pos])] = matching.instance[pos][: len(inst)]  # a window marker adds a row
        asm.add_rank(trace, chosen, inst, dims[pos], p2p)
    asm.add_collectives(frozenset(k for k, it in enumerate(matching.instances) if not is_symmetric(it.collective)),
                        {k: it.ranks[1] for k, it in enumerate(matching.instances) if it.p2p})
    g = asm.finish()
    g.meta = g.meta.replace(
        world_size=run.world_size,
        ranks=[t.rank for t in run.ranks],
        steps=chosen,
        backend=run.ranks[0].backend,
        framework=run.meta.framework or run.ranks[0].meta.framework or None,
        measured_iter_us={t.rank: measured_iter_us(t, chosen) for t in run.ranks},
        loop_steps=loop_steps(run),
        buckets=run.ranks[0].buckets,
        source=run.source,
        warnings=run.meta.warning_texts(),
        parallel=parallel,
        horovod=run.meta.horovod,
        layer_grad_bytes=dict(run.ranks[0].meta.layer_grad_bytes),
        layer_saved_bytes=dict(run.ranks[0].meta.layer_saved_bytes),
        host_cpus={h: (sum(t.host == h for t in run.ranks), min(t.meta.cpus for t in run.ranks if t.host == h))
                   for h in {t.host for t in run.ranks if t.host and t.meta.cpus > 0}},
    )
    if run.meta.fsdp:
        from .build_fsdp import fsdp_meta  # noqa: PLC0415  (it imports this module's users)

        g.meta.fsdp = fsdp_meta(run)
    return g


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
    [``dst_at``, ``until``] and released when ``src_at`` passes); NaN otherwise.
    """

    src: np.ndarray
    dst: np.ndarray
    rule: np.ndarray
    src_at: np.ndarray
    dst_at: np.ndarray
    until: np.ndarray


def anchors(trace: RankTrace, sel: Selection) -> Anchors:
    """Flows whose both ends are graph material, with the instants their rules join."""
    ev = trace.events
    f, rule = trace.flows, trace.rules()
    if len(f):
        n = len(ev)
        ok = (f[:, 0] >= 0) & (f[:, 1] >= 0) & (f[:, 0] < n) & (f[:, 1] < n)
        f, rule = f[ok], rule[ok]
        usable = sel.shared | (sel.owner >= 0)
        ok = usable[f[:, 0]] & usable[f[:, 1]] & ~(sel.shared[f[:, 0]] & sel.shared[f[:, 1]])
        f, rule = f[ok], rule[ok]
    s, d = (f[:, 0], f[:, 1]) if len(f) else (np.empty(0, np.int64), np.empty(0, np.int64))
    s, d, rule = _released_by_inline(trace, sel, s, d, rule)
    end = ev.end
    src_at = np.where(rule == Dep.LAUNCH, ev.start[s], end[s])
    # a rank joins a shared collective when its transfer starts: what the transfer needed from the
    # source (an enqueue call hands the work over inside the call) was done by then
    src_at = np.where(sel.shared[d], np.minimum(src_at, ev.start[d]), src_at)
    until = np.where(rule == Dep.STAGE, np.clip(end[s], ev.start[d], end[d]), end[d])
    # an empty wait (a call that returned at once, or a drain already done) binds where it stands
    wait = (np.isin(rule, _WAIT_RULES) | ((rule == Dep.AFTER) & (ev.kind[d] == Kind.COMM_WAIT))) & ~sel.shared[d] & (until > ev.start[d])
    return Anchors(s, d, rule.astype(np.int16), src_at, ev.start[d].astype(np.float64), np.where(wait, until, np.nan))


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


# ------------------------------------------------------------------ the assembler
@dataclass
class _CollectiveEnd:
    """One rank's view of a collective instance (times on the rank's clock, in us from ``base_ns``)."""

    rank: int
    base_ns: int  # the rank's clock origin, aligned: ``base_ns/1e3 + t`` is on the shared clock
    start: float
    end: float
    prev_end_group: float  # completion of this rank's previous collective in the same group
    ready: list[tuple[int, int]] = field(default_factory=list)  # (node, rule) it waits on (enqueue)
    needs: list[tuple[int, int]] = field(default_factory=list)  # (node, rule) that wait on it
    name: str = ""
    nbytes: int = 0
    bucket: int = -1
    step: int = -1
    lanes: int = 1
    group: str = "0"
    dim: int = 0  # traces.parallelism.Dim


@dataclass(frozen=True, eq=False)
class _SharedView:
    """One collective instance on the shared clock (us), per participating rank (in ``_CollectiveEnd`` order):
    ``shift`` from the rank's clock, ``ready`` (its ready point), ``join`` (its transfer's start),
    ``done`` (when it saw the collective complete)."""

    shift: np.ndarray
    ready: np.ndarray
    join: np.ndarray
    done: np.ndarray


class _Assembler:
    def __init__(self) -> None:
        self.b = GraphBuilder()
        self.mstart = array("d")  # measured dependent instant per node (rank-local clock); NaN: shared
        self.mend = array("d")
        self.src: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []
        self.rule: list[np.ndarray] = []
        self.seen: list[np.ndarray] = []  # u's end as v's rank saw it, NaN: u's own measured end
        self.instances: dict[int, list[_CollectiveEnd]] = {}
        self.fixed_gap: dict[int, float] = {}  # shared nodes: gap not derivable from one clock
        self.comm_lanes = 1  # most collectives a rank ran at once (threads or streams they used)
        self.first_marks: dict[int, float] = {}  # each rank's first step boundary -> its start on the shared clock
        self.base_ns: dict[int, int] = {}  # rank -> its clock's origin, aligned

    def node(self, name: str, kind: Kind, mstart: float, mend: float, dur: float | None = None, order: float | None = None, **kw) -> int:
        """A node measured on [mstart, mend] (NaN: on no single clock; give ``dur`` then)."""
        if order is None:
            order = mstart if np.isfinite(mstart) else 0.0
        v = self.b.add_node(name, kind, dur=mend - mstart if dur is None else dur, order=order, **kw)
        self.mstart.append(mstart)
        self.mend.append(mend)
        return v

    def edges(self, u, v, rule, seen=None) -> None:
        u, v = np.atleast_1d(np.asarray(u, np.int64)), np.atleast_1d(np.asarray(v, np.int64))
        ok = (u >= 0) & (v >= 0) & (u != v)
        self.src.append(u[ok])
        self.dst.append(v[ok])
        self.rule.append(np.broadcast_to(np.asarray(rule, np.int16), u.shape)[ok])
        self.seen.append(np.full(int(ok.sum()), np.nan) if seen is None else np.broadcast_to(np.asarray(seen, float), u.shape)[ok])

    # -- one rank: select -> anchors -> pieces -> nodes -> edges
    def add_rank(self, trace: RankTrace, steps: list[int], instance: np.ndarray, dims: np.ndarray, p2p: tuple[int, ...]) -> None:
        self.base_ns[trace.rank] = int(trace.base_ns)
        sel = select(trace, steps, instance, p2p)
        anc = anchors(trace, sel)
        cut = pieces(trace, sel, anc, steps)
        node_of = self._nodes(trace, cut, steps, sel.main)
        self._flow_edges(trace, sel, anc, cut, node_of, instance, dims)
        self._window_start(cut, node_of, steps)
        self._pool_steps(trace, cut, node_of)
        self._window_end(trace, cut, node_of)

    def _nodes(self, trace: RankTrace, cut: Pieces, steps: list[int], main: int) -> np.ndarray:
        """One node per piece, chained along each lane; returns the node id of every piece."""
        ev, r = trace.events, trace.rank
        devices = [self.b.device(f"rank{r}/{lane.name}", _LANE_DEVICE[lane.kind], rank=r) for lane in trace.lanes]
        # (each column built and its temporaries dropped before the next: 5M pieces are 40 MB a column)
        o, w = np.asarray(cut.owner, np.int64), np.asarray(cut.wait, np.int64)
        mark = o < 0
        oo = np.maximum(o, 0)
        a, z = np.asarray(cut.start, np.float64), np.asarray(cut.end, np.float64)
        # names, steps and layers interned in the order the pieces first use them (as one add_node per piece would)
        key = np.where(mark, -2 - cut.mark.astype(np.int64), ev.name[np.where(w >= 0, w, oo)].astype(np.int64))
        uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
        del key
        ids = np.empty(len(uniq), dtype=np.int64)
        for j in np.argsort(first, kind="stable").tolist():
            k = int(uniq[j])
            ids[j] = self.b.intern(f"rank{r}.step{-2 - k}" if k < 0 else f"rank{r}.{ev.names[k]}")
        name = ids[inv.reshape(-1)]
        del uniq, first, inv
        step = np.where(mark, cut.mark, ev.step[oo]).astype(np.int64)
        layer = np.where(mark, -1, ev.layer[oo]).astype(np.int64)
        lu, lfirst, linv = np.unique(layer, return_index=True, return_inverse=True)
        del layer
        lid = np.full(len(lu), -1, dtype=np.int64)
        for j in np.argsort(lfirst, kind="stable").tolist():
            if lu[j] >= 0:
                lid[j] = self.b.layer(trace.layers[int(lu[j])])
        layer = lid[linv.reshape(-1)]
        del linv
        kind = np.where(w >= 0, int(Kind.COMM_WAIT), ev.kind[oo]).astype(np.int64)
        kind[mark] = int(Kind.STEP)
        mstart = np.where(~mark & (kind == int(Kind.COMM_WAIT)), z, a)  # a wait depends on its end
        mend = np.where(mark, a, z)
        order = np.where(mark & ~np.isfinite(a), 0.0, a)
        device = np.array(devices, dtype=np.int64)[cut.lane] if len(devices) else np.zeros(len(cut), np.int64)
        node_of = self.b.add_nodes(
            name=name, kind=kind, rank=np.full(len(cut), r, dtype=np.int64), device=device, dur=mend - mstart,
            order=order, step=step, layer=layer, bucket=np.where(mark, -1, ev.bucket[oo]),
            nbytes=np.where(mark, 0, ev.nbytes[oo]))
        del name, kind, device, order, step, layer, oo
        self.mstart.frombytes(memoryview(np.ascontiguousarray(mstart, np.float64)).cast("B"))
        self.mend.frombytes(memoryview(np.ascontiguousarray(mend, np.float64)).cast("B"))
        for k in np.flatnonzero(mark & (cut.mark == steps[0])).tolist():
            self.first_marks[int(node_of[k])] = trace.base_ns / 1e3 + float(a[k])  # us on the shared (aligned) clock
        same_lane = cut.lane[1:] == cut.lane[:-1]
        self.edges(node_of[:-1][same_lane], node_of[1:][same_lane], GraphRule.PROGRAM_ORDER)
        if len(cut):
            self.b.meta.main_device[r] = devices[main]
        return node_of

    def _flow_edges(self, trace: RankTrace, sel: Selection, anc: Anchors, cut: Pieces, node_of: np.ndarray, instance: np.ndarray,
                    dims: np.ndarray) -> None:
        """Flows between pieces; flows into or out of a shared collective become its ready points and needs."""
        ev = trace.events
        src_local, dst_local = ~sel.shared[anc.src], ~sel.shared[anc.dst]
        waits = np.isfinite(anc.until)
        u = np.full(len(anc.src), -1, dtype=np.int64)
        v = np.full(len(anc.src), -1, dtype=np.int64)
        q = np.flatnonzero(src_local)
        u[q] = cut.progress(ev.lane[anc.src[q]].astype(np.int64), anc.src_at[q], sel.owner[anc.src[q]])
        q = np.flatnonzero(dst_local & ~waits)
        v[q] = cut.entry(ev.lane[anc.dst[q]].astype(np.int64), anc.dst_at[q], sel.owner[anc.dst[q]])
        q = np.flatnonzero(dst_local & waits)
        v[q] = cut.release(ev.lane[anc.dst[q]].astype(np.int64), anc.until[q], sel.owner[anc.dst[q]])
        u_node = np.where(u >= 0, node_of[np.maximum(u, 0)], -1)
        v_node = np.where(v >= 0, node_of[np.maximum(v, 0)], -1)
        local = src_local & dst_local
        self.edges(u_node[local], v_node[local], anc.rule[local])
        ends = self._collective_ends(trace, sel, instance, dims)
        for k in np.flatnonzero(~local).tolist():
            s, d, rule = int(anc.src[k]), int(anc.dst[k]), int(anc.rule[k])
            if d in ends and u_node[k] >= 0:
                ends[d].ready.append((int(u_node[k]), rule))
            elif s in ends and v_node[k] >= 0:
                ends[s].needs.append((int(v_node[k]), rule))

    def _collective_ends(self, trace: RankTrace, sel: Selection, instance: np.ndarray, dims: np.ndarray) -> dict[int, _CollectiveEnd]:
        """This rank's view of each shared collective, registered with its instance."""
        ev = trace.events
        coll = np.flatnonzero(sel.shared)
        own = coll[ev.depth[coll] == 0]  # gloo runs collectives on a pool of threads (a send/recv on the calling one)
        comm_lanes = most_at_once(ev.start[own], ev.start[own] + ev.dur[own])
        ends: dict[int, _CollectiveEnd] = {}
        prev_group: dict[str, float] = {}
        for i in sorted(coll.tolist(), key=lambda i: ev.start[i] + ev.dur[i]):
            group = trace.groups[int(ev.group[i])] if ev.group[i] >= 0 else "0"
            ce = _CollectiveEnd(
                rank=trace.rank, base_ns=int(trace.base_ns), start=float(ev.start[i]), end=float(ev.start[i] + ev.dur[i]),
                prev_end_group=prev_group.get(group, -np.inf), name=ev.name_of(i), nbytes=int(ev.nbytes[i]),
                bucket=int(ev.bucket[i]), step=int(ev.step[i]), lanes=comm_lanes, group=group, dim=int(dims[i]),
            )
            prev_group[group] = ce.end
            ends[i] = ce
            self.instances.setdefault(int(instance[i]), []).append(ce)
        return ends

    def _window_start(self, cut: Pieces, node_of: np.ndarray, steps: list[int]) -> None:
        """Every other lane's first op follows the first step mark, so it replays at its measured offset from it."""
        opening = np.flatnonzero(cut.mark == steps[0])
        if not len(opening):
            return
        t = float(cut.start[opening[0]])
        first = cut.lane_at[:-1]
        first = first[(first < cut.lane_at[1:]) & (cut.owner[np.minimum(first, len(cut) - 1)] >= 0)]
        first = first[cut.start[first] >= t]
        self.edges(np.full(len(first), node_of[opening[0]]), node_of[first], GraphRule.WINDOW_START)

    def _pool_steps(self, trace: RankTrace, cut: Pieces, node_of: np.ndarray) -> None:
        """A pool thread's first op of each step also follows that step's mark. Its previous op on the thread may be the
        previous step's, ended long before: measured from it alone, the op's overhead held the thread's idle time, which
        averaged over steps delayed every step (Keras ``fit``: a 25 ms gap before the input iterator in one step of four
        put 6 ms into each averaged one)."""
        marks = np.flatnonzero(cut.mark >= 0)
        at = dict(zip(cut.mark[marks].tolist(), marks.tolist()))
        for lane in np.flatnonzero([ln.pool for ln in trace.lanes]).tolist():
            k = np.arange(cut.lane_at[lane], cut.lane_at[lane + 1])
            k = k[cut.owner[k] >= 0]
            if len(k) < 2:
                continue
            step = trace.events.step[cut.owner[k]].astype(np.int64)
            new = k[1:][step[1:] > step[:-1]]
            mark = np.array([at.get(int(s), -1) for s in trace.events.step[cut.owner[new]].tolist()], dtype=np.int64)
            ok = mark >= 0
            ok[ok] = cut.start[mark[ok]] <= cut.start[new[ok]]
            self.edges(node_of[mark[ok]], node_of[new[ok]], GraphRule.STEP_START)

    def _window_end(self, trace: RankTrace, cut: Pieces, node_of: np.ndarray) -> None:
        """The closing step mark follows every lane's last op that ended before it."""
        closing = np.flatnonzero(cut.mark == (cut.mark.max() if len(cut.mark) else -1))
        if not len(closing) or cut.mark.max() < 0:
            return
        t = float(cut.start[closing[-1]])
        last = cut.lane_at[1:] - 1
        last = last[(last >= cut.lane_at[:-1]) & (cut.owner[np.maximum(last, 0)] >= 0)]
        last = last[cut.end[last] <= t + CLOCK_JITTER_US]
        self.edges(node_of[last], np.full(len(last), node_of[closing[-1]]), GraphRule.WINDOW_END)

    # -- collectives -----------------------------------------------------
    def add_collectives(self, rooted: frozenset[int] = frozenset(), receiver: dict[int, int] | None = None) -> None:
        """One SYNC join and one COMM node per instance, timed on the shared (aligned) clock (see the
        module docstring); ``rooted``: instances of collectives that may release a rank before every
        rank joined (broadcast, reduce, send/recv: ``align.clocks.SYMMETRIC`` names the others); ``receiver``:
        a send/recv pair's receiving rank, never released before its sender joined. Its recv may seem to end
        before the send started where the clocks' fit is off (stages share no symmetric collective to align them
        on; under load 30 on 2 cores a recv ended 2 ms before its send started): released early, the recv's
        whole wait for the other stage was a fixed gap again, a bubble no what-if moved."""
        receiver = receiver or {}
        if not self.instances:
            return
        ref = min(c.base_ns for ends in self.instances.values() for c in ends)
        views = {k: self._view(ends, ref) for k, ends in self.instances.items()}
        done: dict[str, float] = {}  # channel -> when its previous collective completed (shared clock)
        released: list[tuple[int, int]] = []  # (instance, rank position) released before the last join
        links: list[tuple[int, int, int, float]] = []  # (u, v, rule, seen), added at once
        for inst in sorted(views, key=lambda k: (views[k].ready.max(), views[k].done.min())):
            ends, view = self.instances[inst], views[inst]
            head = ends[0]
            channel = self.b.device(f"group {head.group}", DeviceKind.COMM)
            self.comm_lanes = max(self.comm_lanes, max(c.lanes for c in ends))
            alone = len({c.rank for c in ends}) == 1  # no peer recorded: its measured span is all we know
            at = (head.start, head.end) if alone else (np.nan, np.nan)  # measured on one clock, or on none
            sync = self.node(f"sync.{head.name}.{inst}", Kind.SYNC, at[0], at[0], dur=0.0, order=0.0, step=head.step, bucket=head.bucket)
            self.fixed_gap[sync] = 0.0
            early = view.done < view.join.max() - CLOCK_JITTER_US if inst in rooted and not alone else np.zeros(len(ends), dtype=bool)
            early &= np.array([c.rank != receiver.get(inst, -1) for c in ends], dtype=bool)
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
            comm = self.node(f"{head.name}.{inst}", Kind.COMM, *at, dur=dur, order=0.0, device=channel, step=head.step, bucket=head.bucket,
                             nbytes=head.nbytes, dim=dim)
            self.fixed_gap[comm] = gap
            links.append((sync, comm, GraphRule.COLLECTIVE, np.nan))
            for p, (c, t) in enumerate(zip(ends, seen)):
                links += [(u, sync, rule, np.nan) for u, rule in c.ready]
                if not early[p]:
                    links += [(comm, v, rule, t) for v, rule in c.needs]
        for inst, p in released:
            links += self._release_early(inst, p, views[inst])
        u, v, rule, seen = zip(*links)
        self.edges(np.array(u), np.array(v), np.array(rule), np.array(seen))

    def _release_early(self, inst: int, p: int, view: _SharedView) -> list[tuple[int, int, int, float]]:
        """Rank ``p`` completed ``inst`` before the last rank joined (a broadcast's receiver gets its data
        once the root sent it): it waited only for the ranks that had joined by then. Its own join of
        those, released at its completion; the transfer's time is in the join's gap."""
        ends = self.instances[inst]
        c = ends[p]
        needed = [q for q in range(len(ends)) if view.join[q] <= view.done[p] + CLOCK_JITTER_US and ends[q].ready]
        join = self.node(f"rank{c.rank} sync.{c.name}.{inst}", Kind.SYNC, np.nan, np.nan, dur=0.0, order=0.0, step=c.step, bucket=c.bucket)
        self.fixed_gap[join] = max(0.0, float(view.done[p] - max((view.ready[q] for q in needed), default=view.done[p])))
        seen = float(view.done[p] - view.shift[p])
        return [(u, join, rule, np.nan) for q in needed for u, rule in ends[q].ready] + [(join, v, rule, seen) for v, rule in c.needs]

    def _view(self, ends: list[_CollectiveEnd], ref_ns: int) -> _SharedView:
        shift = np.array([(c.base_ns - ref_ns) / 1e3 for c in ends])
        ready = np.array([max((self.mend[u] for u, _ in c.ready), default=c.start) for c in ends]) + shift
        join = np.array([c.start for c in ends]) + shift
        return _SharedView(shift, ready, join, np.array([self._completion(c) for c in ends]) + shift)

    def _completion(self, c: _CollectiveEnd) -> float:
        """When the rank saw the collective complete: its transfer's end, or earlier where something
        that needed the result went ahead before it (a worker thread records its span's end only after
        it woke the waiting thread, and may be descheduled in between)."""
        waited = min((self.mstart[v] for v, _ in c.needs if np.isfinite(self.mstart[v])), default=c.end)
        return max(c.start, min(c.end, waited))

    # -- gaps --------------------------------------------------------------
    def finish(self) -> Graph:
        n = len(self.mstart)
        cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.empty(0, dt)  # noqa: E731
        src, dst, rule, seen = cat(self.src, np.int64), cat(self.dst, np.int64), cat(self.rule, np.int16), cat(self.seen, np.float64)
        mstart, mend = np.array(self.mstart, dtype=np.float64), np.array(self.mend, dtype=np.float64)
        seen_end = np.where(np.isnan(seen), mend[src] if len(src) else seen, seen)
        latest = np.full(n, -np.inf)
        ok = np.isfinite(seen_end)
        np.maximum.at(latest, dst[ok], seen_end[ok])
        gap = np.where(np.isfinite(latest) & np.isfinite(mstart), np.maximum(mstart - latest, 0.0), 0.0)
        for v, fixed in self.fixed_gap.items():
            gap[v] = fixed
        first = min(self.first_marks.values(), default=0.0)
        for v, t in self.first_marks.items():  # ranks start as skewed as they were measured
            gap[v] = t - first
        self.b.add_edges(src, dst)
        self.b.meta.comm_lanes = self.comm_lanes
        origin = min(self.base_ns.values(), default=0)
        self.b.meta.provenance = Provenance(mstart, mend, src, dst, rule, seen_end, {r: (b - origin) / 1e3 for r, b in self.base_ns.items()})
        return self.b.build().replace(gap=gap)


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
    return owner


def most_at_once(start: np.ndarray, end: np.ndarray) -> int:
    """The most intervals open at one time (at least 1); one that ends as another starts does not overlap it.

    Collectives of one rank that overlap share the link, so their spans are not their transfer
    times; a pool of threads taking turns (JAX, TensorFlow) is not that."""
    if not len(start):
        return 1
    t = np.concatenate([start, end])
    delta = np.concatenate([np.ones(len(start), np.int64), -np.ones(len(end), np.int64)])
    order = np.lexsort((delta, t))  # at a tie the end comes first
    return max(int(np.cumsum(delta[order]).max()), 1)
