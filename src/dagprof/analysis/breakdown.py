"""Where each rank's iteration goes: compute, communication, their overlap, and idle time.

Computed on a replayed timeline (measured or what-if alike), so the same numbers describe a
profile and its predictions.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..graph.build_ps import DONE
from ..graph.dag import DeviceKind, Graph
from ..intervals import length, union
from ..replay import ReplayResult, replay
from ..traces.events import CommRole, Kind
from ..traces.parallelism import Dim

_COMPUTE = np.array([Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE, Kind.KERNEL, Kind.OTHER, Kind.DATA, Kind.MEMCPY])


@dataclass
class RankBreakdown:
    rank: int
    iter_us: float
    compute_us: float  # busy time of the rank's compute devices (union)
    comm_us: float  # time any collective the rank takes part in is in flight (union)
    overlap_us: float  # communication hidden behind compute
    wait_us: float  # time this rank's ready points waited at collectives for slower ranks
    # the part of ``wait_us`` at the job's own collectives beside DDP's gradient buckets (``own_collectives``)
    own_wait_us: float = 0.0
    own_names: tuple[str, ...] = ()  # those collectives where this rank waited, by kind ("barrier x2")

    @property
    def exposed_comm_us(self) -> float:
        return self.comm_us - self.overlap_us

    def to_dict(self, per: float = 1.0) -> dict:
        ms = lambda us: us / per / 1e3  # noqa: E731
        return {
            "rank": self.rank,
            "iter_ms": self.iter_us / 1e3,
            "compute_ms": ms(self.compute_us),
            "comm_ms": ms(self.comm_us),
            "overlap_ms": ms(self.overlap_us),
            "exposed_comm_ms": ms(self.exposed_comm_us),
            "straggler_wait_ms": ms(self.wait_us),
            "own_collective_wait_ms": ms(self.own_wait_us),
        }


def iteration_times(g: Graph, res: ReplayResult) -> dict[int, float]:
    """Predicted mean iteration time per rank (us) from the step boundary nodes."""
    out = {}
    steps = max(len(g.meta.steps), 1)
    for r in g.ranks():
        marks = np.flatnonzero((g.kind == Kind.STEP) & (g.rank == r))
        if len(marks) >= 2:
            out[int(r)] = float(res.start[marks].max() - res.start[marks].min()) / steps
    return out


def job_iteration_us(g: Graph, res: ReplayResult | None = None) -> float:
    """The job's iteration time: its slowest rank's, a parameter server's workers' mean (``GraphMeta.job_of``; ``g`` is
    replayed when no result is given)."""
    return g.meta.job_of(list(iteration_times(g, res if res is not None else replay(g)).values()))


def other_workers_us(ref: Graph, ref_res: ReplayResult, g: Graph, res: ReplayResult) -> float:
    """A parameter server's job on another worker count (``g``, replayed as ``res``) from the same job at the profiled
    count (``ref``): ``ref``'s workers' mean times the change of the span from the first step mark to the last exchange's
    end (``exchanges_span_us``; ``g``'s own workers' mean where either has no exchange). The copies' own
    windows would weigh each profiled worker's last-step tail by how many copies it has (``whatif --workers``)."""
    span, ref_span = exchanges_span_us(g, res), exchanges_span_us(ref, ref_res)
    if not span or not ref_span:
        return job_iteration_us(g, res)
    return job_iteration_us(ref, ref_res) * span / ref_span


def exchanges_span_us(g: Graph, res: ReplayResult) -> float | None:
    """The replayed job from its first step mark to the last pull of its last exchange (``DONE``); None without exchanges.

    The workers meet only at the servers, so their exchanges of a step end together, where each worker's step marks fall
    wherever its own program puts them: a worker whose last step ends soon after its pulls (no loss printed, no parameters
    saved) closes its window before one that does, and nothing in the window makes it wait for that tail. The workers' mean
    of their windows (``GraphMeta.job_of``, what is measured) then depends on which profiled workers the copies of
    ``--workers`` are of: ``mx_gru_forecast.py``'s worker 0, which prints and saves, ran a 28.6 ms window alone and 28.6
    beside worker 1's 25.7 at 10 Gbit/s, so 1 worker came out slower than 2. This span holds no such tail, and no worker
    added can end it sooner (each only adds pushes a sum waits for); the exchanges' period alone would not do either: the
    first exchange waits for a peer that started late, which shortens it with the peer."""
    if DONE not in g.names:
        return None
    done = np.flatnonzero(g.name == g.names.index(DONE))
    marks = np.flatnonzero(g.kind == Kind.STEP)
    if not len(done) or not len(marks):
        return None
    return float(res.start[done].max() - res.start[marks].min())


def breakdown(g: Graph, res: ReplayResult) -> list[RankBreakdown]:
    iters = iteration_times(g, res)
    comm = np.flatnonzero(g.kind == Kind.COMM)
    comm_iv = union(res.start[comm], res.end[comm])
    waits, own = _straggler_waits(g, res)
    compute_dev = np.array([d.kind != DeviceKind.COMM for d in g.devices] + [False])  # index -1 -> False
    out = []
    for r in g.ranks():
        mine = np.flatnonzero((g.rank == r) & np.isin(g.kind, _COMPUTE) & compute_dev[g.device])
        comp_iv = union(res.start[mine], res.end[mine])
        out.append(
            RankBreakdown(
                rank=int(r),
                iter_us=iters.get(int(r), float("nan")),
                compute_us=length(comp_iv),
                comm_us=length(comm_iv),
                overlap_us=length(_intersect(comp_iv, comm_iv)),
                wait_us=waits.get(int(r), 0.0),
                own_wait_us=sum(own.get(int(r), {}).values()),
                own_names=by_kind(g, list(own.get(int(r), {}))),
            )
        )
    return out


def own_collectives(g: Graph) -> np.ndarray:
    """The shared COMM nodes a DDP job issued beside its gradient buckets: its own barriers and its logging, metric or
    evaluation all-reduces (DDP's buffer broadcasts and ``join`` all-reduces too). A rank arriving last there was held by
    work the others skip or do unevenly before them (rank 0's checkpoint ahead of a barrier, an evaluation pass),
    not by a slow link or node; in a job without buckets (FSDP, other frameworks) nothing is told apart. Only those of
    the data-parallel group (``Dim.DP``): a hybrid job's tensor- or pipeline-parallel ones are the model's own work.
    ZeRO-1's parameter broadcasts are not the job's own: they are its optimizer's data parallelism (``traces.zero_run``),
    where a rank arrives last because it steps the larger shard."""
    comm = (g.kind == Kind.COMM) & (g.rank < 0)
    if not (comm & (g.bucket >= 0)).any():
        return np.zeros(len(g), dtype=bool)
    return comm & (g.bucket < 0) & (g.dim == Dim.DP) & (g.role != CommRole.ZERO_PARAMS)


def by_kind(g: Graph, nodes: list[int]) -> tuple[str, ...]:
    """Collective nodes counted by kind, their names less the instance ("barrier.18" -> "barrier x2")."""
    kinds = Counter(g.node_name(int(c)).rsplit(".", 1)[0] for c in nodes)
    return tuple(f"{k} x{n}" for k, n in sorted(kinds.items()))


def _straggler_waits(g: Graph, res: ReplayResult) -> tuple[dict[int, float], dict[int, dict[int, float]]]:
    """Per rank: time a thread sat blocked on a collective because another rank entered it later; and per rank, that
    time at each of ``own_collectives`` (collective node -> us).

    Enqueueing an all-reduce does not block (backward goes on), so arrival skew at a join is
    not lost time by itself; it is lost where a rank's op is gated by the collective's end.
    There, the blocked time (collective end minus the op's own lane readiness) is charged to
    stragglers up to how much later than this rank the last rank arrived.
    """
    waits: dict[int, float] = {}
    own: dict[int, dict[int, float]] = {}
    is_own = own_collectives(g)
    is_comm = (g.kind == Kind.COMM) & (g.rank < 0)
    for v in np.flatnonzero((g.rank >= 0) & (res.gate >= 0)):
        c = int(res.gate[v])
        if not is_comm[c]:
            continue
        preds = g.predecessors(v)
        lane = preds[g.device[preds] == g.device[v]]
        ready = float(res.end[lane].max()) if len(lane) else float(res.start[v])
        blocked = max(0.0, float(res.end[c]) - ready)
        syncs = [p for p in g.predecessors(c) if g.kind[p] == Kind.SYNC]
        if not syncs or blocked == 0.0:
            continue
        arrivals = g.predecessors(syncs[0])
        mine = arrivals[g.rank[arrivals] == g.rank[v]]
        if len(mine):
            late = float(res.end[arrivals].max() - res.end[mine].max())
            r, lost = int(g.rank[v]), min(max(late, 0.0), blocked)
            waits[r] = waits.get(r, 0.0) + lost
            if is_own[c] and lost > 0.0:
                own.setdefault(r, {})[c] = own.get(r, {}).get(c, 0.0) + lost
    return waits, own


def _intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i, 0], b[j, 0]), min(a[i, 1], b[j, 1])
        if lo < hi:
            out.append((lo, hi))
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return np.array(out).reshape(-1, 2)
