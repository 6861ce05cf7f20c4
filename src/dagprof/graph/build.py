"""Events -> one global dataflow graph over all ranks (dPRO's global DFG).

Rules, all derived from the normalised events (``traces.events`` conventions):
- every depth-0 event of a lane is a node; a lane's nodes form a chain (program order);
- a depth-0 op with a flow endpoint nested inside (a kernel launch, a device sync) is split at
  that point, so a kernel depends on the moment of its launch, not on the end of the enclosing op;
- a host wait (``COMM_WAIT``) costs no time of its own: it ends when what it waits for ends, and
  whatever it measured beyond that becomes overhead (gap);
- a collective instance (matched across ranks by ``align.matching``) becomes one shared ``COMM``
  node on its process group's channel behind a ``SYNC`` join of every rank's ready point: it starts
  only once every participant entered it, so waiting for a slower rank emerges in the replay. The
  channel serves one collective at a time and each one's duration is its completion minus the later
  of its own readiness and the previous completion, on the rank where that is shortest (the last to
  enter waits for nobody). Spaced by completions, the replay reproduces when collectives finish even
  where a profile's spans overlap (gloo runs two at once on a shared link) or include queueing
  (hook spans run from issue to completion); ``meta["comm_lanes"]`` says whether they overlapped;
- each node's ``gap`` is its measured start minus the latest measured end of its predecessors
  (clipped at 0): the framework overhead the replayer adds back (dPRO);
- zero-cost ``STEP`` nodes mark every step boundary on each rank's main lane; each rank's first one
  starts at its measured offset from the earliest rank (clocks aligned beforehand), so the replay
  begins as skewed as the run did.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..align.matching import Matching
from ..align.one_clock import on_one_clock
from ..errors import DagprofError
from ..traces.events import Kind, LaneKind, RankTrace, Run
from ..traces.steps import iteration_us
from .dag import DeviceKind, Graph, GraphBuilder

_LANE_DEVICE = {LaneKind.CPU_THREAD: DeviceKind.HOST, LaneKind.GPU_STREAM: DeviceKind.COMPUTE, LaneKind.COMM_THREAD: DeviceKind.COMM}
_END_MARK = -1  # event id of the closing step marker


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


def build_graph(run: Run, steps: range | None = None, matching: Matching | None = None) -> Graph:
    """The global DAG of ``run`` over the steps all ranks profiled, its ranks' clocks aligned first (once)."""
    if not run.ranks:
        raise DagprofError("no rank traces to build a graph from", run.source)
    chosen = common_steps(run, steps)
    run, matching = on_one_clock(run, matching)
    asm = _Assembler()
    for pos, trace in enumerate(run.ranks):
        asm.add_rank(trace, chosen, matching.instance[pos])
    asm.add_collectives()
    g = asm.finish()
    g.meta.update(
        world_size=run.world_size,
        ranks=[t.rank for t in run.ranks],
        steps=chosen,
        backend=run.ranks[0].backend,
        measured_iter_us={t.rank: measured_iter_us(t, chosen) for t in run.ranks},
        buckets=[{"index": bk.index, "nbytes": bk.nbytes, "params": bk.params} for bk in run.ranks[0].buckets],
        source=run.source,
    )
    g.meta.update(run.meta.get("graph_meta", {}))
    return g


@dataclass
class _CollectiveEnd:
    """One rank's view of a collective instance."""

    rank: int
    start: float
    end: float
    prev_end: float  # completion of this rank's previous collective
    ready: list[int] = field(default_factory=list)  # node ids it waits on (enqueue)
    needs: list[int] = field(default_factory=list)  # node ids that wait on it
    name: str = ""
    nbytes: int = 0
    bucket: int = -1
    step: int = -1
    lanes: int = 1
    group: str = "0"


class _Assembler:
    def __init__(self) -> None:
        self.b = GraphBuilder()
        self.mstart: list[float] = []  # measured start per node (rank-local clock)
        self.mend: list[float] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.edge_end: dict[tuple[int, int], float] = {}  # measured end of u as seen by v, when u is shared
        self.instances: dict[int, list[_CollectiveEnd]] = {}
        self.fixed_gap: dict[int, float] = {}  # shared nodes: gap not derivable from one clock
        self.comm_lanes = 1  # most collectives a rank ran at once (threads or streams they used)
        self.first_marks: dict[int, float] = {}  # each rank's first step boundary -> its start on the shared clock

    # -- nodes and edges -------------------------------------------------
    def node(self, name: str, kind: Kind, mstart: float, mend: float, **kw) -> int:
        v = self.b.add_node(name, kind, dur=mend - mstart, order=mstart, **kw)
        self.mstart.append(mstart)
        self.mend.append(mend)
        return v

    def edge(self, u: int, v: int) -> None:
        if u != v:
            self.src.append(u)
            self.dst.append(v)

    # -- one rank --------------------------------------------------------
    def add_rank(self, trace: RankTrace, steps: list[int], instance: np.ndarray) -> None:
        ev = trace.events
        r = trace.rank
        in_steps = np.isin(ev.step, steps)
        top = (ev.depth == 0) & (ev.kind != Kind.STEP) & in_steps
        coll = top & (instance >= 0)
        top &= ~coll
        flows = _valid_flows(trace)
        owner = _owners(trace, top | coll)
        # Split points inside depth-0 ops, from nested flow endpoints.
        cuts: dict[int, set[float]] = {}
        waits: dict[int, list[int]] = {}
        for s, d in flows:
            if not (top[s] or coll[s]) and owner[s] >= 0:
                cuts.setdefault(int(owner[s]), set()).add(float(ev.start[s] + ev.dur[s]))
            if not (top[d] or coll[d]) and owner[d] >= 0:
                o = int(owner[d])
                cuts.setdefault(o, set()).add(float(ev.start[d]))
                if ev.kind[d] == Kind.COMM_WAIT:
                    cuts[o].add(float(ev.start[d] + ev.dur[d]))
                    waits.setdefault(o, []).append(int(d))
        first: dict[int, int] = {}  # event -> first piece's node (incoming edges)
        piece_at: dict[tuple[int, float], int] = {}  # (event, piece start) -> node
        piece_end: dict[tuple[int, float], int] = {}  # (event, piece end) -> node
        last: dict[int, int] = {}
        spans = trace.step_spans()
        spans = spans[np.isin(spans[:, 0].astype(int), steps)]
        main_lane = next((i for i, lane in enumerate(trace.lanes) if lane.main), 0)
        for lane_id, lane in enumerate(trace.lanes):
            sel = np.flatnonzero(top & (ev.lane == lane_id))
            items = [(float(ev.start[i]), 1, int(i)) for i in sel]
            if lane_id == main_lane:
                items += [(float(s), 0, -2 - int(step)) for step, s, _ in spans]
                items.append((float(spans[:, 2].max()), 2, _END_MARK))
            if not items:
                continue
            device = self.b.device(f"rank{r}/{lane.name}", _LANE_DEVICE[lane.kind], rank=r)
            items.sort()
            chain: list[int] = []
            prev_end = -np.inf
            for s, _, i in items:
                s = max(s, prev_end)  # readers guarantee no overlap; tolerate rounding
                if i < 0:
                    step = max(steps) + 1 if i == _END_MARK else -2 - i
                    chain.append(self.node(f"rank{r}.step{step}", Kind.STEP, s, s, rank=r, device=device, step=step))
                    if step == steps[0]:
                        self.first_marks[chain[-1]] = trace.base_ns / 1e3 + s  # us on the shared (aligned) clock
                    prev_end = s
                    continue
                e = max(s, float(ev.start[i] + ev.dur[i]))
                bounds = sorted({s, e, *(c for c in cuts.get(i, ()) if s < c < e)})
                wait_spans = {(float(ev.start[w]), float(ev.start[w] + ev.dur[w])): w for w in waits.get(i, [])}
                for a, z in zip(bounds[:-1], bounds[1:]) if len(bounds) > 1 else [(s, e)]:
                    w = wait_spans.get((a, z))
                    kind = Kind.COMM_WAIT if w is not None else Kind(int(ev.kind[i]))
                    name = ev.name_of(w if w is not None else i)
                    v = self._event_node(trace, i, kind, name, a, z, device)
                    first.setdefault(i, v)
                    piece_at[(i, a)] = v
                    piece_end[(i, z)] = v
                    last[i] = v
                    chain.append(v)
                prev_end = e
            for u, v in zip(chain[:-1], chain[1:]):
                self.edge(u, v)
            if lane_id == main_lane:
                self.b.meta.setdefault("main_device", {})[r] = device

        def out_node(s: int) -> int | None:
            if top[s]:
                return last.get(s)
            o = int(owner[s])
            return piece_end.get((o, float(ev.start[s] + ev.dur[s]))) if o >= 0 and top[o] else None

        def in_node(d: int) -> int | None:
            if top[d]:
                return first.get(d)
            o = int(owner[d])
            return piece_at.get((o, float(ev.start[d]))) if o >= 0 and top[o] else None

        ends: dict[int, _CollectiveEnd] = {}
        prev_end = -np.inf
        comm_lanes = len(np.unique(ev.lane[coll])) or 1  # gloo runs collectives on a pool of threads
        for i in sorted(np.flatnonzero(coll), key=lambda i: ev.start[i] + ev.dur[i]):
            i = int(i)
            ce = _CollectiveEnd(
                rank=r, start=float(ev.start[i]), end=float(ev.start[i] + ev.dur[i]), prev_end=prev_end,
                name=ev.name_of(i), nbytes=int(ev.nbytes[i]), bucket=int(ev.bucket[i]), step=int(ev.step[i]),
                lanes=comm_lanes, group=trace.groups[int(ev.group[i])] if ev.group[i] >= 0 else "0",
            )
            prev_end = ce.end
            ends[i] = ce
            self.instances.setdefault(int(instance[i]), []).append(ce)
        for s, d in flows:
            s, d = int(s), int(d)
            if d in ends:
                u = out_node(s) if not coll[s] else None
                if u is not None:
                    ends[d].ready.append(u)
            elif s in ends:
                v = in_node(d)
                if v is not None:
                    ends[s].needs.append(v)
            else:
                u, v = out_node(s), in_node(d)
                if u is not None and v is not None:
                    self.edge(u, v)

    def _event_node(self, trace: RankTrace, i: int, kind: Kind, name: str, a: float, z: float, device: int) -> int:
        ev = trace.events
        layer = int(ev.layer[i])
        mstart = z if kind == Kind.COMM_WAIT else a  # a wait is released when its target ends
        return self.node(
            f"rank{trace.rank}.{name}", kind, mstart, z, rank=trace.rank, device=device, step=int(ev.step[i]),
            layer=self.b.layer(trace.layers[layer]) if layer >= 0 else -1, bucket=int(ev.bucket[i]), nbytes=int(ev.nbytes[i]),
        )

    # -- collectives -----------------------------------------------------
    def add_collectives(self) -> None:
        for inst in sorted(self.instances, key=lambda k: min(c.start for c in self.instances[k])):
            ends = self.instances[inst]
            head = ends[0]
            channel = self.b.device(f"group {head.group}", DeviceKind.COMM)
            self.comm_lanes = max(self.comm_lanes, max(c.lanes for c in ends))
            sync = self.node(f"sync.{head.name}.{inst}", Kind.SYNC, 0.0, 0.0, step=head.step, bucket=head.bucket)
            self.fixed_gap[sync] = 0.0
            durs, gaps = [], []
            for c in ends:
                ready = max((self.mend[u] for u in c.ready), default=c.start)
                free = max(ready, c.prev_end)
                durs.append(c.end - free)
                gaps.append(c.start - free)
            dur = min(durs)
            comm = self.node(f"{head.name}.{inst}", Kind.COMM, 0.0, dur, device=channel, step=head.step, bucket=head.bucket, nbytes=head.nbytes)
            self.fixed_gap[comm] = max(0.0, min(gaps))
            self.edge(sync, comm)
            for c in ends:
                for u in c.ready:
                    self.edge(u, sync)
                for v in c.needs:
                    self.edge(comm, v)
                    self.edge_end[(comm, v)] = c.end

    # -- gaps --------------------------------------------------------------
    def finish(self) -> Graph:
        n = len(self.mstart)
        src = np.asarray(self.src, dtype=np.int64)
        dst = np.asarray(self.dst, dtype=np.int64)
        mend = np.asarray(self.mend)
        seen_end = mend[src] if len(src) else np.empty(0)
        for k, (u, v) in enumerate(zip(self.src, self.dst)):
            if (u, v) in self.edge_end:
                seen_end[k] = self.edge_end[(u, v)]
        latest = np.full(n, -np.inf)
        np.maximum.at(latest, dst, seen_end)
        mstart = np.asarray(self.mstart)
        gap = np.where(np.isfinite(latest), np.maximum(mstart - latest, 0.0), 0.0)
        for v, fixed in self.fixed_gap.items():
            gap[v] = fixed
        first = min(self.first_marks.values(), default=0.0)
        for v, t in self.first_marks.items():  # ranks start as skewed as they were measured
            gap[v] = t - first
        self.b.add_edges(src, dst)
        self.b.meta["comm_lanes"] = self.comm_lanes
        return self.b.build().replace(gap=gap)


def _valid_flows(trace: RankTrace) -> np.ndarray:
    f = trace.flows
    if not len(f):
        return f.reshape(0, 2)
    n = len(trace.events)
    ok = (f[:, 0] >= 0) & (f[:, 1] >= 0) & (f[:, 0] < n) & (f[:, 1] < n)
    return f[ok]


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
