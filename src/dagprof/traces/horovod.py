"""Horovod: its timeline merged with every rank's dagprof hooks into one run.

A Horovod run folder is a dagprof run folder (``manifest.json``, ``rank<R>.json``: per-layer
compute, optimizer, step times) plus what ``dagprof.collect.horovod`` adds:
``rank<R>.horovod.json`` per rank (each gradient's all-reduce request with its Horovod tensor
name, time and bytes; the settings) and ``horovod_timeline.json``, Horovod's own Chrome trace
of the profiled window, written by rank 0 (the coordinator) only.

The timeline itself is read by ``horovod_timeline``.

Events this reader adds to each rank (``events.py`` conventions):
- main lane: a ``COMM_ENQUEUE`` per request (``horovod request allreduce.<param>``; a sparse gradient's two,
  ``allgather.<param>.indices`` and ``.values``), cut out of the backward span it happened in;
- a ``horovod background thread`` lane per rank, per response: ``horovod negotiate`` (rank 0 only, ``CommRole.NEGOTIATION``:
  the cycle that picked it up: from the later of the cycle start and every rank's last request of the cycle, each rank's
  own record on rank 0's clock, to the response start; first response of a cycle only; ``graph.build`` joins those
  requests before it, so the rank that asked last holds it), ``horovod memcpy in`` (into the fusion buffer,
  or the copy to the output for a single tensor), the transfer (``COMM``, group ``horovod``,
  ``seq`` = response number, ``bucket`` = its position in the step, ``nbytes`` = fused bytes),
  ``horovod memcpy out``;
- flows: request -> negotiate (or memcpy in), memcpy in -> transfer -> memcpy out -> the step's
  ``synchronize()`` wait (COMM_WAIT) on the main lane.
Horovod writes the timeline on rank 0 only. Every rank executes the same responses in the
same order (the coordinator decides them), and a synchronous all-reduce ends on all ranks
together, so the other ranks' copies and transfers are rank 0's, shifted onto their clock; their
requests and waits are their own. They get no negotiation span: rank 0's cycle is not theirs, and
what they spent between their last request and the response was mostly waiting for the slower
rank, which the transfer's join models (their copy-in starts when their own tensors are ready).
Where every rank kept its Horovod trace log (``traces.horovod_log``), each rank's own end of each response says how long
after rank 0 its last peer left it (``HorovodRecord.peer_lags``), and so how much of rank 0's next negotiation waited for
that peer (``peer_waits``: the wire in the span, which the link what-ifs scale; ``graph.build`` puts it on the node).
"""
from __future__ import annotations

import bisect
import dataclasses
import os
from dataclasses import dataclass
from typing import Annotated, NamedTuple

import msgspec
import numpy as np

from ..errors import DagprofError
from ..fsutil import inside, read_versioned
from .buckets import Bucket, BucketLayout
from .dagprof_run import read_run
from .events import CommKind, CommRole, EventRows, EventTable, Kind, Lane, LaneKind, RankTrace, Run
from .horovod_log import RankLog, read_logs
from .horovod_timeline import Response, Timeline, read_timeline
from .meta import AtResponse, Collectives, HorovodRecord, RankMeta, RunWarning, tx_bytes_per_step, warnings_of
from .run_schema import CpuList, checked_cpu_set

TIMELINE = "horovod_timeline.json"
OWN_CALLS = "horovod-own-collectives.rank{rank}.json"  # a rank's note: the script exchanged gradients without DistributedOptimizer
RANK_FORMAT = "dagprof-horovod-rank"
_OWN_CALLS = msgspec.json.Decoder(dict[str, Annotated[int, msgspec.Meta(ge=0)]])  # hvd call name -> times called
VERSION = 1
GROUP = "horovod"
LANE = "horovod background thread"
NEGOTIATE = "horovod negotiate"
REQUEST = "horovod request "  # + Horovod tensor name
WAIT_NAME = "horovod synchronize (wait for all-reduces)"
_DDP_WAIT = "ddp finalize (wait for buckets)"  # what the hook reader calls the same records
_NOT_DDP = "no DDP gradient buckets"
# what a DistributedOptimizer sends: dense gradients all-reduced, a sparse one's indices and values all-gathered (the
# response's bytes are then the gathered result's, which the cost model prices as half an all-reduce of them; every rank
# gives the rows its step touched, so more ranks gather more: ``CommRole.SPARSE``)
COLLECTIVES = ("allreduce", "allgather")


def horovod_rank_file(rank: int) -> str:
    return f"rank{rank}.horovod.json"


def tensor_collective(tensor: str) -> str:
    """A Horovod tensor's collective, from the name Horovod gives it (``allreduce.fc.weight``,
    ``allgather.embed.weight.values``; ``grouped_allreduce.fc.weight_2of5``: a tensor of an explicit group, all-reduced)."""
    return tensor.partition(".")[0].removeprefix("grouped_")


# ---------------------------------------------------------------- the run
@dataclass
class _Request:
    step: int
    tensor: str
    t0: int  # ns, the rank's clock
    t1: int
    nbytes: int


@dataclass
class _Planned:
    """A response placed in a profiled step, with each rank's requests for its tensors."""

    resp: Response
    step: int
    position: int  # within the step
    nbytes: int
    requests: dict[int, list[_Request]]  # rank -> requests (one per tensor)
    first_in_cycle: bool


def own_calls(path: str) -> dict[str, int]:
    """The note a rank leaves when its script exchanged gradients by its own ``hvd.*`` calls: each call and how often."""
    try:
        with open(path, "rb") as f:
            return _OWN_CALLS.decode(f.read())
    except (OSError, msgspec.DecodeError) as err:
        raise DagprofError(f"not a note of Horovod calls ({err})", path) from None


class HorovodSettings(msgspec.Struct, kw_only=True, frozen=True):
    """Horovod's settings as its rank file recorded them (None: not recorded)."""

    fusion_threshold_bytes: int | None = None
    cycle_time_ms: float | None = None
    cache_capacity: int | None = None
    autotune: bool | None = None


class HorovodRankDoc(msgspec.Struct, kw_only=True):
    """``rank<R>.horovod.json`` (``collect.hooks.horovod`` writes it): typed, so that a value of the wrong type is one
    line naming the file and field. ``enqueues``: (step, tensor, start ns, end ns, bytes) of each gradient request."""

    rank: int
    world_size: int | None = None  # checked against the run's (read before unchecked: another job's file read as this one's)
    settings: HorovodSettings = HorovodSettings()
    timeline: str | None = None
    warnings: list[str] = []
    cpus: Annotated[int, msgspec.Meta(ge=0)] | None = None  # recordings before the dagprof rank file said its cores
    cpu_set: CpuList = ""  # which cores (recordings before 2026-12-06 lack it)
    window_tx_bytes: Annotated[int, msgspec.Meta(ge=0)] | None = None  # the host's interfaces over the window (None: not counted)
    log: str | None = None  # the rank's Horovod trace lines of the window (``traces.horovod_log``; None: not kept)
    utc_offset_s: int | None = None  # the host's local time offset, which the log's stamps are in
    enqueues: list[tuple[int, str, int, int, int]] = []


def _read_doc(path: str) -> HorovodRankDoc:
    return read_versioned(path, HorovodRankDoc, RANK_FORMAT, range(1, VERSION + 1), "dagprof Horovod rank file", "profile the job again")


def read_horovod_run(path: str | os.PathLike[str]) -> Run:
    """A Horovod run folder -> one ``Run`` whose ranks carry Horovod's requests, responses and transfers."""
    folder = os.fspath(path)
    run = read_run(folder)
    docs = {t.rank: _read_doc(os.path.join(folder, horovod_rank_file(t.rank))) for t in run.ranks}
    for r, d in docs.items():
        if d.rank != r:
            raise DagprofError(f"holds rank {d.rank}, not rank {r} (a copy of another rank's file?)", os.path.join(folder, horovod_rank_file(r)))
        if d.world_size is not None and d.world_size != run.world_size:
            raise DagprofError(f"holds rank {r} of {d.world_size}, not of {run.world_size}: another job's file",
                               os.path.join(folder, horovod_rank_file(r)))
    warnings: list[str | RunWarning] = [w for w in run.meta.warnings if _NOT_DDP not in w.what]
    for d in docs.values():
        warnings += [w for w in d.warnings if w not in warnings]
    requests = {r: [_Request(*q) for q in d.enqueues] for r, d in docs.items()}
    _check_requests(requests, {t.rank: t for t in run.ranks}, folder)
    settings = docs[min(docs)].settings
    tl_name = docs[min(docs)].timeline
    tl_path = inside(folder, tl_name, os.path.join(folder, horovod_rank_file(min(docs)))) if tl_name else None
    timeline = None
    if tl_path and os.path.exists(tl_path):
        timeline = read_timeline(tl_path)
        warnings += [RunWarning(p, file=tl_name) for p in timeline.problems]
    else:
        warnings.append("no Horovod timeline in the run (start the job with HOROVOD_TIMELINE=DYNAMIC): "
                        "requests and waits only, no fusion or transfers")
    plan: list[_Planned] = []
    lag_us = 0.0
    if timeline:
        _check_same_time(timeline, run.ranks[0], tl_path)
        _check_no_join(timeline, run.ranks[0], tl_path)
        lag_us, placed = _align(timeline, requests, run.ranks[0])
        timeline, plan = timeline.shifted(lag_us), placed.plan
        if lag_us:
            warnings.append(RunWarning(f"Horovod's timeline is dated {lag_us / 1e3:.3f} ms early (its epoch read across a preemption at "
                                       f"hvd.init?): moved {lag_us / 1e3:.3f} ms later, onto rank {min(requests)}'s steps", file=tl_name))
        if placed.dropped:
            warnings.append(f"{placed.dropped} Horovod response(s) outside the profiled steps or without matching requests were left out")
        if placed.own:
            steps, n = len({p.step for p in plan}) or 1, placed.own_responses
            warnings.append(f"Horovod collectives the script calls itself are not modelled ({', '.join(sorted(placed.own))}): "
                            f"{n} response{'s' if n != 1 else ''}, {placed.own_us / 1e3 / steps:.1f} ms a step on Horovod's timeline "
                            "(a wait for the other ranks included); the main thread's time in them is kept as measured in the ops "
                            "where the script calls them (other:<phase>), on the critical path and in every what-if")
        _check_served(placed, requests, tl_path, warnings)
    shifts = {t.rank: _clock_shift(t, run.ranks[0], plan) for t in run.ranks}
    log_paths = _log_paths(folder, docs)
    kept = sum(p is not None for p in log_paths.values())
    if 0 < kept < len(log_paths):
        warnings.append(f"Horovod's trace log kept by {kept} of {len(log_paths)} ranks: each rank's own response ends unused, "
                        "the negotiations priced as measured")
    lags = _peer_lags(plan, read_logs(log_paths, {r: d.utc_offset_s for r, d in docs.items()}), shifts, warnings) if plan else {}
    waits: list[_PeerWait] = []
    traces = [_with_doc(t, docs[t.rank], os.path.join(folder, horovod_rank_file(t.rank))) for t in run.ranks]
    cut = {t.rank: _with_requests(t, requests.get(t.rank, [])) for t in traces}
    asked = _Asked({q: (t.base_ns + end * 1e3 + shifts[t.rank]) / 1e3 for t in traces for q, end in cut[t.rank].ends().items()})
    ranks = [_merge(t, cut[t.rank], plan, shifts[t.rank], lags, waits, asked) for t in traces]
    if asked.alone:
        warnings.append(f"{asked.alone} of {asked.alone + asked.joined} Horovod negotiations wait for rank {min(docs)}'s own requests only "
                        "(a rank's request for their tensors not recorded): their spans keep the wait for the other ranks as measured")
    order = _tensor_order(plan)
    sizes: dict[str, int] = {}  # as Horovod fuses and sends them: compressed (hvd.Compression.fp16) ones at their wire size
    dtypes: dict[str, str] = {}
    for p in plan:
        for rq in p.requests[min(p.requests)]:
            sizes[rq.tensor] = p.resp.nbytes.get(rq.tensor) or rq.nbytes
            dtypes[rq.tensor] = _dtype(p.resp)
    hv = HorovodRecord(
        fusion_threshold_bytes=settings.fusion_threshold_bytes, cycle_time_ms=settings.cycle_time_ms,
        cache_capacity=settings.cache_capacity, autotune=settings.autotune,
        tensor_order=order, tensor_bytes=sizes, tensor_dtypes=dtypes, cycles_marked=bool(timeline is not None and len(timeline.cycles)),
        responses=len(plan), timeline=tl_name, timeline_lag_us=lag_us, world_size=run.world_size,
        measured=[(p.step, p.position, p.nbytes, p.resp.transfer[1] - p.resp.transfer[0],
                   p.resp.t0 - p.resp.cycle if p.first_in_cycle and p.resp.cycle is not None else -1.0) for p in plan],
        peer_lags=[AtResponse(plan[i].step, plan[i].position, lag) for i, lag in sorted(lags.items())], peer_waits=_wire_waits(waits),
    )
    if settings.autotune:
        warnings.append("HOROVOD_AUTOTUNE was on: fusion threshold and cycle time changed during the run")
    return Run(ranks, source=folder, meta=msgspec.structs.replace(run.meta, warnings=warnings_of(warnings), framework="horovod", horovod=hv))


def _log_paths(folder: str, docs: dict[int, HorovodRankDoc]) -> dict[int, str | None]:
    """Each rank's Horovod trace log, as its rank file names it (inside the run folder only); None where it names none or
    the file is not there (the collector could not write it: counted by the caller, with the ranks that kept none)."""
    paths = {r: inside(folder, d.log, os.path.join(folder, horovod_rank_file(r))) if d.log else None for r, d in docs.items()}
    return {r: p if p is not None and os.path.exists(p) else None for r, p in paths.items()}


def _check_requests(requests: dict[int, list[_Request]], traces: dict[int, RankTrace], folder: str) -> None:
    """Each rank's requests run forwards, lie in its own profiled steps (a second's slack) and size every all-reduced
    tensor as the first rank does (Horovod itself refuses other shapes); anything else is a damaged or another run's file."""
    ref = min(requests)
    sizes = {(q.step, q.tensor): q.nbytes for q in requests[ref] if tensor_collective(q.tensor) == "allreduce"}
    for r, qs in requests.items():
        path = os.path.join(folder, horovod_rank_file(r))
        backwards = [q for q in qs if q.t1 < q.t0]
        if backwards:
            raise DagprofError(f"{len(backwards)} request(s) end before they begin ({backwards[0].tensor} in step {backwards[0].step}): "
                               "a damaged file", path)
        other = [q for q in qs if sizes.get((q.step, q.tensor), q.nbytes) != q.nbytes]
        if other:
            q = other[0]
            raise DagprofError(f"{len(other)} all-reduce(s) sized unlike rank {ref}'s ({q.tensor} in step {q.step}: {q.nbytes} B, rank {ref} "
                               f"{sizes[(q.step, q.tensor)]} B): a damaged or another run's file", path)
        spans = traces[r].step_spans()
        if not len(spans):
            continue
        lo, hi = traces[r].base_ns + spans[0, 1] * 1e3 - 1e9, traces[r].base_ns + spans[-1, 2] * 1e3 + 1e9
        profiled = set(spans[:, 0].astype(int).tolist())
        away = [q for q in qs if q.step in profiled and not lo <= q.t0 <= hi]
        if away:
            raise DagprofError(f"{len(away)} request(s) of the profiled steps are timed more than a second outside them "
                               f"({away[0].tensor} in step {away[0].step}): another run's file, or its clock moved", path)


def _with_doc(t: RankTrace, doc: HorovodRankDoc, path: str) -> RankTrace:
    """The rank with the cores its Horovod rank file (``path``) recorded where its dagprof rank file did not (recordings
    made before the collector wrote ``cpus`` there), so ``GraphMeta.host_cpus`` says them for every Horovod run; and the
    bytes the host sent per profiled step (``RankMeta.window_tx_bytes_per_step``) where the window's were counted."""
    meta = t.meta
    if meta.cpus <= 0 and doc.cpus:
        meta = msgspec.structs.replace(meta, cpus=doc.cpus, cpu_set=checked_cpu_set(doc.cpu_set, doc.cpus, path))
    if (per_step := tx_bytes_per_step(doc.window_tx_bytes, meta.steps_profiled)) is not None:
        meta = msgspec.structs.replace(meta, window_tx_bytes_per_step=per_step)
    return t if meta is t.meta else dataclasses.replace(t, meta=meta)


def _check_same_time(tl: Timeline, ref: RankTrace, path: str) -> None:
    """The timeline is written by the first rank's process, on its clock: responses that all lie outside that rank's
    profiled window (with a second's slack) are another run's; matched by tensor name they replayed as a cycle."""
    spans = ref.step_spans()
    if not tl.responses or not len(spans):
        return
    start, end = ref.base_ns / 1e3 + spans[0, 1], ref.base_ns / 1e3 + spans[-1, 2]
    first, last = min(r.t0 for r in tl.responses), max(r.t1 for r in tl.responses)
    gap_us = max(first - end, start - last)
    if gap_us > 1e6:
        raise DagprofError(f"its responses are {gap_us / 1e6:.0f} s {'after' if first > end else 'before'} the profiled steps of "
                           f"{os.path.basename(ref.source)}: it is another run's timeline", path)
    late = [r.t1 - end for r in tl.responses if start <= r.t0 <= end and r.t1 > end + 1e6]
    if late:  # read before as an all-reduce of that long inside a step, exit 0
        raise DagprofError(f"{len(late)} response(s) start in the profiled steps of {os.path.basename(ref.source)} but end up to "
                           f"{max(late) / 1e6:.0f} s after them: a start paired with the end of a later session (events appended "
                           "to the timeline)", path)


def _check_no_join(tl: Timeline, ref: RankTrace, path: str) -> None:
    """An ``hvd.join()`` that returned between the first rank's first and last profiled step is refused: the ranks that ran
    out of batches waited in it while the others trained on, so from there a rank's step N pairs with another's N+1 and the
    replay would book the wait in an ordinary step (2026-12-06, hvd_bert_mlm_join: the model of the profiled run +5.7 %, the
    averaged replay +19.5 %). One epoch end's join said in one line, with the window that ends before it."""
    spans = ref.step_spans()
    if not tl.joins or not len(spans):
        return
    at = [j for j in tl.joins if ref.base_ns / 1e3 + spans[0, 1] < j < ref.base_ns / 1e3 + spans[-1, 2]]
    if at:
        before = spans[spans[:, 2] + ref.base_ns / 1e3 <= at[0], 0]
        last = int(before[-1]) if len(before) else int(spans[0, 0])
        raise DagprofError(f"hvd.join() returned inside the profiled steps {int(spans[0, 0])}-{int(spans[-1, 0])} (after rank "
                           f"{ref.rank}'s step {last}; {len(at)} join(s)): the ranks' batches were uneven, those that ran out waited "
                           "in it while the others trained on, and their steps no longer pair up, which dagprof does not model; "
                           f"profile steps that end before it (--steps {int(spans[0, 0])}:{last} at most)", path)


def _check_served(placed: _Placement, requests: dict[int, list[_Request]], path: str, warnings: list[str | RunWarning]) -> None:
    """Gradients requested in the profiled steps that no response in the timeline served (a timeline cut short, or another
    run's) would be replayed without their all-reduce: none served is refused, some counted."""
    ref = min(requests)
    unserved = len(requests[ref]) - placed.served
    if unserved and not placed.served:
        raise DagprofError(f"none of the {unserved} gradient requests of rank {ref} in the profiled steps has a response in this "
                           "timeline: it was cut short before them, or is another run's", path)
    if unserved:
        warnings.append(RunWarning(f"{unserved} of {len(requests[ref])} gradient requests of rank {ref} in the profiled steps have no "
                                   "response in the timeline (cut short?): replayed without their all-reduce", file=os.path.basename(path)))


@dataclass
class _Placement:
    plan: list[_Planned]
    dropped: int  # responses to requested tensors left out (no request before them, or not a collective we model)
    own: set[str]  # tensors of collectives the script called itself (hvd.allreduce of a metric...)
    served: int  # rank 0's requests with their response
    own_responses: int  # the responses that performed them
    own_us: float  # their spans on the timeline, summed (us)


@dataclass
class _Fit:
    """The responses placed with the timeline ``lag`` us later; ``latest``: the largest lag keeping them in time."""

    lag: float
    latest: float
    placement: _Placement

    @property
    def score(self) -> tuple[int, int]:
        return self.placement.served, -self.placement.dropped


_SLACK_US = 20.0  # a synchronize return read a little before its response's end: clock reads of two threads


def _align(tl: Timeline, requests: dict[int, list[_Request]], ref: RankTrace) -> tuple[float, _Placement]:
    """How late (us) the timeline must move to be on rank 0's clock, and the responses placed so.

    Its epoch can only be early (``Timeline.shifted``), by a scheduler slice or more when it is. In time, every response
    ends before rank 0's last ``synchronize()`` of its step returns. Tried: as written, then each shift that puts a
    response's end on a synchronize return, smallest first, up to the first that serves every request of the window;
    kept: the first serving most requests in time, moved as late as its responses stay in time (the closest return
    then follows its response at once: on time, returns follow within tens of us). No shift below ``_least_lag`` serves
    every request, so the search starts there: tried from 0, a timeline early by a step or more placed every response
    once per shift below it (quadratic in its length); all are tried only where no shift serves every request."""
    ev = ref.events
    waits = ev.kind == Kind.COMM_WAIT
    ends: dict[int, float] = {}
    for s, e in zip(ev.step[waits], ref.base_ns / 1e3 + ev.start[waits] + ev.dur[waits]):
        ends[int(s)] = max(ends.get(int(s), -np.inf), float(e))
    whole = (len(requests[min(requests)]), 0)

    def fit(lag: float) -> _Fit | None:
        """None: a response ends after its step's last synchronize return."""
        out = _plan(tl.shifted(lag) if lag else tl, requests)
        room = min((ends[p.step] - p.resp.t1 for p in out.plan if p.step in ends), default=0.0)
        return _Fit(lag, lag + max(room, 0.0), out) if room >= -_SLACK_US else None

    def search(lags: list[float]) -> _Fit | None:
        best: _Fit | None = None
        for lag in lags:
            got = fit(lag)
            if got is not None and (best is None or got.score > best.score):
                best = got
            if best is not None and best.score == whole:
                break
        return best

    lags = [0.0] + sorted({e - r.t1 for e in ends.values() for r in tl.responses if e - r.t1 > 0})
    least = _least_lag(tl, requests[min(requests)])
    best = None if least is None else search(lags[max(bisect.bisect_left(lags, least) - 1, 0):])
    if best is None or best.score != whole:
        best = search(lags)
    if best is None:
        return 0.0, _plan(tl, requests)
    if best.lag == 0.0:  # in time as written: the epoch was read unpreempted, as nearly always
        return 0.0, best.placement
    latest = fit(best.latest)
    return (latest.lag, latest.placement) if latest is not None and latest.score == best.score else (best.lag, best.placement)


def _least_lag(tl: Timeline, requests: list[_Request]) -> float | None:
    """The least shift (us) after which each of a rank's ``requests`` precedes a response to its tensor: per tensor, the
    k-th last of its n requests must precede the k-th last of its responses, which is what ``_plan`` needs of them all.
    None where some tensor has fewer responses than requests (no shift serves them all)."""
    asked: dict[str, list[float]] = {}
    for rq in requests:
        asked.setdefault(rq.tensor, []).append(rq.t0 / 1e3)
    starts: dict[str, list[float]] = {}
    for resp in tl.responses:
        if resp.op in COLLECTIVES:
            for t in resp.tensors:
                if t in asked:
                    starts.setdefault(t, []).append(resp.start[t])
    least = 0.0
    for t, q in asked.items():
        s = sorted(starts.get(t, []))
        if len(s) < len(q):
            return None
        least = max(least, float(np.max(np.sort(q) - np.array(s[len(s) - len(q):]))))
    return least


def _plan(tl: Timeline, requests: dict[int, list[_Request]]) -> _Placement:
    """Place each response in the step whose requests it served, on every rank."""
    ref = min(requests)
    by_key: dict[int, dict[tuple[int, str], list[_Request]]] = {}
    for r, reqs in requests.items():
        table = by_key.setdefault(r, {})
        for rq in sorted(reqs, key=lambda x: x.t0):
            table.setdefault((rq.step, rq.tensor), []).append(rq)
    ref_by_tensor: dict[str, list[_Request]] = {}
    for rq in sorted(requests[ref], key=lambda x: x.t0):
        ref_by_tensor.setdefault(rq.tensor, []).append(rq)
    used: dict[int, set[int]] = {r: set() for r in requests}
    requested = set(ref_by_tensor)
    out: list[_Planned] = []
    dropped = 0
    own: set[str] = set()
    own_responses, own_us = 0, 0.0
    seen_cycle: set[float] = set()
    position: dict[int, int] = {}
    for resp in tl.responses:
        if not requested.intersection(resp.tensors):
            own.update(resp.tensors)
            own_responses, own_us = own_responses + 1, own_us + resp.t1 - resp.t0
            continue
        if resp.op not in COLLECTIVES:
            dropped += 1
            continue
        per_rank: dict[int, list[_Request]] = {r: [] for r in requests}
        step = None
        ok = True
        for t in resp.tensors:
            cands = [rq for rq in ref_by_tensor.get(t, []) if rq.t0 / 1e3 <= resp.start[t] and id(rq) not in used[ref]]
            if not cands:
                ok = False
                break
            mine = cands[-1]
            step = mine.step if step is None else step
            k = by_key[ref][(mine.step, t)].index(mine)
            for r in requests:
                lst = by_key[r].get((mine.step, t), [])
                if k >= len(lst) or id(lst[k]) in used[r]:
                    ok = False
                    break
                per_rank[r].append(lst[k])
            if not ok:
                break
        if not ok or step is None:
            dropped += 1
            continue
        for r, lst in per_rank.items():
            used[r].update(id(x) for x in lst)
        nbytes = sum(resp.nbytes.get(t) or rq.nbytes for t, rq in zip(resp.tensors, per_rank[ref]))
        first = resp.cycle is not None and resp.cycle not in seen_cycle
        if resp.cycle is not None:
            seen_cycle.add(resp.cycle)
        out.append(_Planned(resp, step, position.get(step, 0), nbytes, per_rank, first or resp.cycle is None))
        position[step] = position.get(step, 0) + 1
    return _Placement(out, dropped, own, sum(len(p.requests[ref]) for p in out), own_responses, own_us)


def _tensor_order(plan: list[_Planned]) -> list[str]:
    """Tensors in the order Horovod fuses them (its response cache's order), as the first step shows."""
    order: list[str] = []
    for p in plan:
        order += [t for t in p.resp.tensors if t not in order]
    return order


def _clock_shift(trace: RankTrace, ref: RankTrace, plan: list[_Planned]) -> int:
    """ns to subtract from rank 0's (timeline) times to put them on ``trace``'s clock.

    Ranks on rank 0's host share its clock. Elsewhere: each step's ``synchronize`` returns on
    every rank right after the step's last response ends, so the median difference of those
    ends (steps where both ranks waited) estimates the offset; the clock alignment refines it.
    """
    if trace.rank == ref.rank or not plan or (trace.host and trace.host == ref.host):
        return 0
    diffs = []
    ends = {}
    for t in (trace, ref):
        ev = t.events
        m = (ev.kind == Kind.COMM_WAIT) & (ev.dur > 100.0)
        ends[t.rank] = {int(s): t.base_ns + int((a + d) * 1e3) for s, a, d in zip(ev.step[m], ev.start[m], ev.dur[m])}
    for s, e in ends[trace.rank].items():
        if s in ends[ref.rank]:
            diffs.append(e - ends[ref.rank][s])
    return -int(np.median(diffs)) if diffs else 0


@dataclass
class _Cut:
    """A rank's events with its requests cut in (``_cut_requests``): ``events`` maps ``id(request)`` to its event."""

    rows: EventRows
    main: int  # the rank's main lane
    events: dict[int, int]

    def ends(self) -> dict[int, float]:
        """``id(request)`` -> the end of its event, us on the rank's clock."""
        cols = self.rows.columns()
        return {q: float(cols["start"][i] + cols["dur"][i]) for q, i in self.events.items()}


@dataclass
class _Asked:
    """Every rank's recorded requests, each's end in epoch us on the timeline's clock (``id(request)`` -> us), and how many
    of the writer's negotiations waited for every rank's (``joined``) or, a rank's request not recorded, its own only."""

    ends: dict[int, float]
    joined: int = 0
    alone: int = 0


def _with_requests(trace: RankTrace, reqs: list[_Request]) -> _Cut:
    c = EventRows.extending(trace.events, trace.flows)
    c.rename(_DDP_WAIT, WAIT_NAME)  # the same records mean Horovod's synchronize() here
    main = next((i for i, lane in enumerate(trace.lanes) if lane.main), 0)
    return _Cut(c, main, _cut_requests(c, main, reqs, lambda ns: (ns - trace.base_ns) / 1e3))


def _merge(trace: RankTrace, cut: _Cut, plan: list[_Planned], shift_ns: int, lags: dict[int, float],
           waits: list[_PeerWait], asked: _Asked) -> RankTrace:
    """The rank's events with its requests cut in and its lane of Horovod's responses (module docstring). The writer's
    negotiation of a cycle begins once every rank's last request of it ended (``asked``: each rank's own record; where one
    is not, once its own did, counted there); those that followed a response whose last peer left it ``lags`` us after
    rank 0 add to ``waits`` (step, position, us of the span before that peer left, the previous response's bytes)."""
    c, main, request_ev = cut.rows, cut.main, cut.events
    us = lambda ns: (ns - trace.base_ns) / 1e3  # noqa: E731
    if not plan:
        return _rebuild(trace, c, [], trace.meta)
    cols = c.columns()  # the run's rows and the requests
    ends = lambda rows: (cols["start"][i] + cols["dur"][i] for i in rows)  # noqa: E731
    lanes = list(trace.lanes) + [Lane(LANE, LaneKind.COMM_THREAD)]
    lane = len(lanes) - 1
    groups = list(trace.groups) + ([GROUP] if GROUP not in trace.groups else [])
    gid = groups.index(GROUP)
    sinks = _sinks(cols, main)
    # per step, its last synchronize's return; where none was recorded, its update's start (the update waits for the responses)
    released = {s: float(cols["start"][i] + (cols["dur"][i] if cols["kind"][i] == Kind.COMM_WAIT else 0.0)) for s, i in sinks.items()}
    at = lambda epoch_us: us(int(round(epoch_us * 1e3)) - shift_ns)  # noqa: E731
    coll_events, coll_dtypes = [], []
    negotiate = -1
    writer = trace.rank == 0  # the coordinator, whose timeline this is
    lane_free = -np.inf
    for seq, p in enumerate(plan):
        mine = p.requests.get(trace.rank, [])
        r = p.resp
        t0, (x0, x1), t1 = at(r.t0), (at(v) for v in r.transfer), at(r.t1)
        fused = len(r.tensors) > 1
        if not writer:
            # rank 0's cycle and negotiation are not this rank's: from its last request to the response it mostly waited
            # for the slower rank, which the transfer's join models (as a span or an idle gap on this lane, an averaged
            # replay would charge that wait as a fixed delay); its copy-in starts when its tensors and its lane are ready
            own = max(ends(request_ev[id(q)] for q in mine if id(q) in request_ev), default=t0)
            t0 = min(t0, max(own, lane_free))
            negotiate = -1
            # its transfer and copy out, rank 0's shifted, were over once its own synchronize returned: rank 0's may end
            # later (its thread descheduled), an exit lag of rank 0's (``graph.shared_collectives``), not this rank's
            # wait; kept, this rank replayed late from there on, and with it rank 0's next negotiation, which joins its requests
            done = released.get(p.step, t1)
            x1, t1 = max(min(x1, done), x0), max(min(t1, done), x0)
        elif p.first_in_cycle and r.cycle is not None:
            every = [q for q2 in plan if q2.resp.cycle == r.cycle for qs in q2.requests.values() for q in qs]
            if all(id(q) in asked.ends for q in every):  # the coordinator agrees a tensor once the last rank asked for it
                asked.joined += 1
                ready = max(at(asked.ends[id(q)]) for q in every)
            else:
                asked.alone += 1
                ready = max(ends(request_ev[id(q)] for q2 in plan if q2.resp.cycle == r.cycle for q in q2.requests.get(trace.rank, [])
                                 if id(q) in request_ev), default=-np.inf)
            a = min(max(at(r.cycle), ready), t0)
            negotiate = c.add(name=NEGOTIATE, kind=int(Kind.OTHER), lane=lane, start=a, dur=t0 - a, step=p.step, bucket=p.position,
                              role=int(CommRole.NEGOTIATION))
            if seq - 1 in lags:  # the span waited for the last peer to leave the previous response
                waits.append(_PeerWait(p.step, p.position, float(np.clip(at(plan[seq - 1].resp.t1) + lags[seq - 1] - a, 0.0, t0 - a)),
                              plan[seq - 1].nbytes))
        elif r.cycle is None:
            negotiate = -1
        prep = c.add(name="horovod memcpy in" if fused else "horovod copy in", kind=int(Kind.MEMCPY), lane=lane, start=t0,
                     dur=max(x0 - at(r.t0), 0.0), step=p.step, nbytes=p.nbytes, bucket=p.position)
        kind = CommKind.of(r.op)
        comm = c.add(name=f"horovod {r.op} {_short(r.tensors)}", kind=int(Kind.COMM), lane=lane, start=x0, dur=x1 - x0,
                     step=p.step, nbytes=p.nbytes, group=gid, seq=seq, bucket=p.position, comm_kind=int(kind),
                     role=int(CommRole.SPARSE if kind == CommKind.ALL_GATHER else CommRole.PLAIN))  # ``COLLECTIVES``
        post = c.add(name="horovod memcpy out" if fused else "horovod copy out", kind=int(Kind.MEMCPY), lane=lane, start=x1,
                     dur=max(t1 - x1, 0.0), step=p.step, nbytes=p.nbytes, bucket=p.position)
        lane_free = max(t1, x1)
        coll_events.append(comm)
        coll_dtypes.append(_dtype(r))
        head = negotiate if negotiate >= 0 else prep
        c.flows += [(request_ev[id(q)], head) for q in mine if id(q) in request_ev]
        c.flows += [(prep, comm), (comm, post)]
        if p.step in sinks:
            c.flows.append((post, sinks[p.step]))
    buckets = tuple(Bucket(p.position, p.nbytes, tuple(p.resp.tensors)) for p in plan if p.step == plan[0].step)
    meta = msgspec.structs.replace(trace.meta, collectives=Collectives(event=coll_events, kind=[CommKind.of(p.resp.op) for p in plan], dtype=coll_dtypes),
                                   horovod_clock_shift_ns=shift_ns)
    out = _rebuild(trace, c, buckets, meta)
    return dataclasses.replace(out, lanes=lanes, groups=groups,
                               group_ranks={**trace.group_ranks, GROUP: list(range(trace.world_size))})


def _peer_lags(plan: list[_Planned], logs: dict[int, RankLog], shifts: dict[int, int], warnings: list[str | RunWarning]) -> dict[int, float]:
    """Per response of ``plan`` (its index) that every rank's log holds: how long after rank 0 its last peer left it, us
    (negative: rank 0 left last). A rank's logged response is the one of the same tensors that ended nearest rank 0's, on
    rank 0's clock (``shifts``), and no further than a quarter of the time between two of them on rank 0."""
    if not logs:
        return {}
    ref = min(logs)
    ends = {r: _ends_by_tensors(log) for r, log in logs.items()}
    out: dict[int, float] = {}
    for i, p in enumerate(plan):
        key = frozenset(p.resp.tensors)
        mine = _nearest(ends[ref].get(key, []), p.resp.t1)
        if mine is None:
            continue
        got = [_nearest(ends[r].get(key, []), mine - shifts[r] / 1e3) for r in logs if r != ref]
        if got and all(e is not None for e in got):
            out[i] = max(e + shifts[r] / 1e3 for r, e in zip((r for r in logs if r != ref), got)) - mine
    missed = len(plan) - len(out)
    bad = {r: (log.unreadable, log.unpaired) for r, log in logs.items() if log.unreadable or log.unpaired}
    if bad:
        warnings.append("Horovod's trace log: " + "; ".join(f"rank {r}: {u} line(s) unreadable, {n} response(s) without their start "
                                                           "or end" for r, (u, n) in sorted(bad.items())))
    if missed:
        warnings.append(f"Horovod's trace log: {missed} of {len(plan)} responses not found on every rank: their peers' ends unknown, "
                        "the negotiations after them priced as measured")
    return out


class _PeerWait(NamedTuple):
    """A negotiation of rank 0's that began while the last peer was still in the previous response (``_merge``)."""

    step: int
    position: int  # its response's in the step
    us: float  # of its span, before that peer left
    nbytes: int  # the previous response's


def _wire_waits(waits: list[_PeerWait]) -> list[AtResponse]:
    """Each negotiation's wait for the last peer (``_merge``) as wire time: at most the median wait after responses of the
    same bytes (a peer still receiving the same tail), the rest a descheduled peer, which a slower wire does not stretch."""
    typical: dict[int, float] = {}
    for nb in {w.nbytes for w in waits}:
        held = [w.us for w in waits if w.nbytes == nb and w.us > 0]
        typical[nb] = float(np.median(held)) if held else 0.0
    return [AtResponse(w.step, w.position, min(w.us, typical[w.nbytes])) for w in waits]


def _ends_by_tensors(log: RankLog) -> dict[frozenset[str], list[float]]:
    out: dict[frozenset[str], list[float]] = {}
    for x in log.responses:
        out.setdefault(x.tensors, []).append(x.end_us)
    return {k: sorted(v) for k, v in out.items()}


def _nearest(ends: list[float], at: float) -> float | None:
    """The end in the sorted ``ends`` nearest ``at``, where it is nearer than a quarter of the spacing of ``ends`` (a second
    where there is one)."""
    if not ends:
        return None
    k = bisect.bisect_left(ends, at)
    best = min(ends[max(k - 1, 0):k + 1], key=lambda e: abs(e - at))
    spacing = float(np.min(np.diff(ends))) if len(ends) > 1 else 4e6
    return best if abs(best - at) < spacing / 4 else None


def _dtype(r: Response) -> str:
    return r.dtype.lower().removeprefix("horovod_")


def _short(tensors: list[str]) -> str:
    head = tensors[0].partition(".")[2]  # Horovod names a tensor "<collective>.<name>"
    return head if len(tensors) == 1 else f"{head} +{len(tensors) - 1}"


def _sinks(cols: dict[str, np.ndarray], main: int) -> dict[int, int]:
    """Per step: the main-lane event that waits for the step's responses (its last synchronize, else its update)."""
    waits: dict[int, int] = {}
    updates: dict[int, int] = {}
    order = np.argsort(cols["start"], kind="stable")
    for i in order[(cols["lane"][order] == main) & (cols["depth"][order] == 0) & (cols["step"][order] >= 0)].tolist():
        step = int(cols["step"][i])
        if cols["kind"][i] == Kind.COMM_WAIT:
            waits[step] = i
        elif cols["kind"][i] == Kind.UPDATE:
            updates.setdefault(step, i)
    return {**updates, **waits}


def _cut_requests(c: EventRows, main: int, reqs: list[_Request], us) -> dict[int, int]:
    """Insert each request as a depth-0 COMM_ENQUEUE on the main lane, splitting the span it ran inside (the flows from
    that span then leave its last piece)."""
    cols = c.columns()
    tops = np.flatnonzero((cols["lane"] == main) & (cols["depth"] == 0) & (cols["kind"] != Kind.STEP))
    tops = tops[np.argsort(cols["start"][tops], kind="stable")].tolist()
    starts = cols["start"][tops].tolist()
    inside: dict[int, list[tuple[float, float, _Request]]] = {}
    for rq in reqs:
        a, b = us(rq.t0), us(rq.t1)
        k = bisect.bisect_right(starts, a) - 1
        if k < 0:
            continue
        i = tops[k]
        if b <= cols["start"][i] + cols["dur"][i] + 1e-3:
            inside.setdefault(i, []).append((a, b, rq))
    cuts: dict[int, list[tuple[float, float, _Request]]] = {}  # per span, its requests from where each begins to where it ends
    for i, items in inside.items():
        cursor, cuts[i] = cols["start"][i], []
        for a, b, rq in sorted(items, key=lambda x: x[0]):
            a, b = max(a, cursor), max(b, a)
            cuts[i].append((a, b, rq))
            cursor = b
    end = {i: cols["start"][i] + cols["dur"][i] for i in cuts}
    for i, pieces in cuts.items():
        cols["dur"][i] = pieces[0][0] - cols["start"][i]  # the span now ends where its first request begins
    out: dict[int, int] = {}
    last_piece: dict[int, int] = {}
    for i, pieces in cuts.items():
        name, kind, lane = c.names[cols["name"][i]], int(cols["kind"][i]), int(cols["lane"][i])
        same = {col: cols[col][i] for col in EventTable.DEFAULTS}  # each piece is of the span's step, layer, group...
        for k, (a, b, rq) in enumerate(pieces):
            out[id(rq)] = c.add(name=REQUEST + rq.tensor, kind=int(Kind.COMM_ENQUEUE), lane=main, start=a, dur=b - a,
                                step=same["step"], nbytes=rq.nbytes)
            upto = pieces[k + 1][0] - b if k + 1 < len(pieces) else max(end[i] - b, 0.0)
            last_piece[i] = c.add(name, kind, lane, b, upto, **{**same, "nbytes": 0})
    c.flows[:] = [(last_piece.get(s, s), d) for s, d in c.flows]
    return out


def _rebuild(trace: RankTrace, c: EventRows, buckets: BucketLayout, meta: RankMeta) -> RankTrace:
    return dataclasses.replace(trace, events=c.table(), flows=c.flow_array(),
                               buckets=buckets or trace.buckets, backend=trace.backend or "horovod", meta=meta)
