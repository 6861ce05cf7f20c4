"""Reader of dagprof's own run folders (written by ``dagprof.collect``).

A run folder holds ``manifest.json`` (job-wide: world size, requested steps) and, per
rank, ``rank<R>.json`` (hook records, bucket layouts, step times, clock, host info) and
optionally ``rank<R>.kineto.json.gz`` (the torch.profiler trace of the same window).
Every file is written atomically, so a folder is readable while other ranks still write.
A rank killed inside its window left ``rank<R>.steps/`` instead (its completed steps, one
line each); it is read from there and what it lost is named (``completeness``).

Hook records are raw timestamps ``[code, a, b, t_ns, x]`` (see ``Rec``); this module turns
them into the event-table conventions of ``events.py``. The main-thread lane of every
profiled step is partitioned completely by depth-0 events: one FORWARD and one BACKWARD
node per leaf-module call, COMM_ENQUEUE per bucket all-reduce call, COMM_WAIT for DDP's
end-of-backward wait, UPDATE for the optimizer, DATA for a torch DataLoader's ``next()``,
and OTHER for every remaining gap (named by phase, e.g. ``other:pre-forward`` = zero_grad,
DDP's buffer broadcast without Kineto, data loading not done by a DataLoader).
A STEP event (depth -1, like Kineto's ``ProfilerStep#N``) spans each step. A layer span cut
by a higher-priority span (enqueue, wait, update) keeps its first piece; the rest is OTHER.

Communication: with Kineto, the transfers are the ``gloo:*`` ops on the ``pt_gloo_runloop``
threads (or NCCL kernels), one lane per thread/stream, all-reduces matched to the comm hook's
buckets in issue order; DDP's buffer broadcasts appear too (bucket -1, host side from Kineto).
Without Kineto, the comm hook's issue -> completion span on the thread that completed it.
``seq`` numbers the collectives of group "0" in issue order over the window (equal on all ranks).
Flows: enqueue -> transfer; transfer -> the step's last COMM_WAIT (or UPDATE), or for a
blocking host collective -> the main-lane event after it. On GPUs the hook spans are host
(launch) time; Kineto's kernels and copies go on their stream lanes, each taking the step,
layer and kind of the main-lane span that launched it (flow launch -> op, op -> the span of
the host sync that waited for it). Not yet run on a real GPU job.

An FSDP2 job's rank file (``RankFile.fsdp``) takes its collectives from ``fsdp_run`` instead: each
all-gather, reduce-scatter and HSDP all-reduce FSDP called, named by unit, on its own process group.

The file format (fields, record codes, versions) is ``run_schema``.
"""
from __future__ import annotations

import contextlib
import os
from collections import Counter

import numpy as np

from ..errors import DagprofError
from ..fsutil import inside, open_input
from .completeness import check_same_job, describe
from .events import EventRows, Kind, Lane, LaneKind, RankTrace, Run
from .fsdp_run import fsdp_comm, label_groups
from .meta import RankGap, RankMeta, RunMeta, RunWarning, warnings_of
from .run_schema import (
    MANIFEST,
    RANK_FORMAT,
    STEPS_ENDED,
    STEPS_HEAD,
    STEPS_LOG,
    Col,
    Ended,
    Manifest,
    RankFile,
    Rec,
    rank_file,
    read_file,
    read_step_log,
    refuse_ranks_beyond,
    steps_dir,
)
from .run_spans import _Comm, _DeviceOp, _Span, _Transfer

_LISTED_STEPS = 1 << 16  # a window longer than this is open-ended: its missing steps are not listed one by one


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    folder = os.fspath(path)
    if not os.path.isdir(folder) or not os.path.exists(os.path.join(folder, MANIFEST)):
        raise DagprofError(f"not a dagprof run folder (no {MANIFEST})", folder)
    return read_file(os.path.join(folder, MANIFEST), Manifest)


def read_run(path: str | os.PathLike[str], require_ddp: bool = False) -> Run:
    """Read every rank of a run folder; corrupt, foreign or duplicated rank files are one-line errors.

    A rank without ``rank<R>.json`` is rebuilt from its step files when it completed steps of the
    window (it was killed inside it); what is lost, and ranks with nothing at all, are listed in
    ``meta.rank_gaps`` (``completeness``: ``load`` refuses such a run unless asked not to).
    A job that was not DDP-wrapped reads fine (compute only) with ``meta.ddp = False``
    and a warning; ``require_ddp=True`` turns that into an error.
    """
    folder = os.fspath(path)
    manifest = read_manifest(folder)
    world = manifest.world_size
    if not 0 < world <= 1 << 20:
        raise DagprofError(f"corrupt or foreign content (world_size {world})", os.path.join(folder, MANIFEST))
    refuse_ranks_beyond(folder, world)
    docs: list[tuple[str, RankFile]] = []
    gaps: list[RankGap] = []
    for r in range(world):
        rpath = os.path.join(folder, rank_file(r))
        f, gap = _rank_doc(folder, r, world)
        if gap is not None:
            gaps.append(gap)
        if f is not None:
            docs.append((rpath, f))
    _check_unique(docs, folder)
    if not docs:
        raise DagprofError(f"no rank completed a profiled step ({describe(gaps, world)})", folder)
    warnings: list[str | RunWarning] = []
    kineto = all(f.kineto_file for _, f in docs)
    if not kineto and any(f.kineto_file for _, f in docs):
        warnings.append("some ranks have no Kineto trace (cut short): communication of every rank from the comm hooks")
    ranks = [read_rank(rpath, f, kineto) for rpath, f in docs]
    with _corrupt(folder):
        check_same_job(ranks, folder)
    warnings += [w for t in ranks for w in t.meta.warnings]
    ddp = any(t.buckets for t in ranks)
    fsdp = all(t.meta.fsdp is not None for t in ranks)
    if not ddp and not fsdp:
        msg = "no DDP gradient buckets were seen: not a DDP job (compute only, no communication)"
        if require_ddp:
            raise DagprofError(msg, folder)
        warnings.append(msg)
    meta = RunMeta(manifest=manifest, ddp=ddp, fsdp=fsdp, warnings=warnings_of(warnings), rank_gaps=gaps,
                   missing_ranks=[g.rank for g in gaps if g.missing_whole])
    return Run(ranks=ranks, source=folder, meta=meta)


def _rank_doc(folder: str, r: int, world: int) -> tuple[RankFile | None, RankGap | None]:
    """Rank ``r``'s file (checked to be rank ``r`` of this job), or its step files rebuilt; the gap, if any."""
    rpath = os.path.join(folder, rank_file(r))
    if os.path.lexists(rpath):  # a dangling link or a link loop is read, and refused as what it is
        f = read_file(rpath, RankFile)
        how = f.ended
    else:
        parts = os.path.join(folder, steps_dir(r))
        f = _from_step_files(parts) if os.path.exists(os.path.join(parts, STEPS_HEAD)) else None
        if f is None or not f.steps_profiled:
            return None, RankGap(r, f"nothing written (no {rank_file(r)}, no completed step): it crashed, was killed, or is still running")
        rpath = os.path.join(parts, STEPS_HEAD)
        how = (f.ended or f"killed (SIGKILL, out of memory), crashed or still running: its step files end at step {f.steps_profiled[-1]}"
               ) + f", no {rank_file(r)}"
    if f.rank != r:
        raise DagprofError(f"holds rank {f.rank}, not rank {r} (a copy of {rank_file(f.rank)}?)", rpath)
    if f.world_size != world:
        raise DagprofError(f"rank {r} of a {f.world_size}-rank job, but manifest.json says {world} ranks: not this run's file", rpath)
    if not how:
        return f, None
    first, stop = f.steps_requested
    profiled = set(f.steps_profiled)
    if stop - first > _LISTED_STEPS:  # an open-ended window (``steps=range(k, sys.maxsize)``): up to the step it died in
        stop = max(profiled, default=first - 1) + 2
    lost = tuple(s for s in range(first, stop) if s not in profiled)
    return (f, RankGap(r, how, lost)) if lost else (f, None)


def _from_step_files(folder: str) -> RankFile:
    """A rank's ``RankFile`` rebuilt from ``head.json`` and the committed lines of ``steps.jsonl`` (its completed steps)."""
    f: RankFile = read_file(os.path.join(folder, STEPS_HEAD), RankFile)
    parts, torn = read_step_log(os.path.join(folder, STEPS_LOG))
    layouts, saved = list(f.bucket_layouts), dict(f.layer_saved_bytes)
    for p in parts:
        if p.rank != f.rank:
            raise DagprofError(f"holds a step of rank {p.rank}, not of rank {f.rank}", os.path.join(folder, STEPS_LOG))
        f.layers += p.layers
        f.layer_grad_bytes.update(p.layer_grad_bytes)
        for k, nb in p.layer_saved_bytes.items():
            saved[k] = max(saved.get(k, 0), nb)
        if p.bucket_layout is not None:
            layouts.append(p.bucket_layout)
        f.warnings += p.warnings
        f.step_times_ns += p.step_times_ns
        f.records += p.records
        f.steps_profiled.append(p.step)
    if torn:
        f.warnings.append(f"rank {f.rank}: the record of the step after {f.steps_profiled[-1] if parts else 'none'} was cut off "
                          "while being written (the process was killed): dropped")
    f.layer_saved_bytes, f.bucket_layouts = saved, layouts
    f.steps_completed = len(f.step_times_ns)
    ended = os.path.join(folder, STEPS_ENDED)
    if os.path.exists(ended):
        f.ended = read_file(ended, Ended).how
    return f


def _check_unique(docs: list[tuple[str, RankFile]], folder: str) -> None:
    """Two rank files written by one process (same host and pid): one is a copy, whatever rank it now claims."""
    seen: dict[tuple[str, int], str] = {}
    for path, f in docs:
        if f.pid:
            other = seen.setdefault((f.host, f.pid), path)
            if other != path:
                raise DagprofError(f"{os.path.relpath(other, folder)} and {os.path.relpath(path, folder)} were written by the same "
                                   f"process ({f.host} pid {f.pid}): one is a copy, not another rank", folder)


def _check_fsdp_indices(info, records: np.ndarray, path: str) -> None:
    """FSDP records name a collective or a unit of the file's lists: one beyond them lost its collective unseen (then
    "mismatched collectives" naming neither file nor record)."""
    code, a = records[:, Col.CODE], records[:, Col.A]
    for codes, listed, what in (((Rec.FSDP_COLL_BEGIN, Rec.FSDP_COLL_END), len(info.collectives), "collective"),
                                ((Rec.FSDP_COPY_OUT_BEGIN, Rec.FSDP_COPY_OUT_END, Rec.FSDP_RESHARD_BEGIN, Rec.FSDP_RESHARD_END),
                                 len(info.units), "unit")):
        named = a[np.isin(code, codes)]
        bad = named[(named < 0) | (named >= listed)]
        if len(bad):
            raise DagprofError(f"{len(bad)} FSDP record(s) name {what} {int(bad[0])}, but the file lists {listed} {what}s: a damaged file", path)


@contextlib.contextmanager
def _corrupt(path: str):
    """A value of an unexpected type or range in a run file is one line naming that file (never a traceback)."""
    try:
        yield
    except (LookupError, TypeError, ValueError, ArithmeticError, AttributeError) as err:
        raise DagprofError(f"corrupt or foreign content ({type(err).__name__}: {' '.join(str(err).split())[:200]})", path) from None


def read_rank(path: str, f: RankFile | None = None, kineto: bool = True) -> RankTrace:
    """One rank from its file at ``path`` (or ``f``, already decoded or rebuilt); ``kineto=False`` ignores its Kineto trace."""
    with _corrupt(path):
        return _read_rank(path, read_file(path, RankFile) if f is None else f, kineto)


def _read_rank(path: str, f: RankFile, kineto: bool) -> RankTrace:
    records = np.asarray(f.records, dtype=np.int64).reshape(-1, len(Col))
    first, stop = f.steps_requested
    profiled, layers = f.steps_profiled, f.layers
    grad_bytes = [f.layer_grad_bytes.get(name, 0) for name in layers]
    run = os.path.dirname(path) or "."
    done = f.steps_completed
    ended = f"training ended after {done} steps (last step {done - 1})" if done else "training never completed a step"
    warnings = list(f.warnings)
    if not profiled and warnings:
        raise DagprofError(f"no step was profiled ({warnings[0]})", path)
    if not profiled:
        raise DagprofError(f"run {run}: steps {first}-{stop - 1} requested but {ended}", path)
    _check_step_times(f, path)
    if len(profiled) < stop - first:
        warnings.append(f"run {run}: steps {first}-{stop - 1} requested but {ended}: steps {profiled[0]}-{profiled[-1]} profiled")
    kpath = None
    if f.kineto_file:  # checked even when the hooks give the communication: a rank file names nothing outside its run
        kpath = inside(run, f.kineto_file, path)
        if not os.path.exists(kpath):
            raise DagprofError("the rank file names this Kineto trace but it is missing", kpath)
        open_input(kpath).close()  # a regular file (a FIFO is refused before any read)
        kpath = kpath if kineto else None
    steps = _steps(records)
    if f.fsdp is not None:
        _check_fsdp_indices(f.fsdp, records, path)
        comm = fsdp_comm(f.fsdp, kpath, f.rank, records, steps, warnings)
    else:
        comm = _kineto_comm(kpath, f.rank, records, steps, warnings) if kpath else None
    if comm is None:
        comm = _hook_comm(records)
    t = records[:, Col.T_NS]
    if steps:  # a hook's time beyond the window by more than a step is damage; it would be left out of every step unseen
        longest = max(b1 - b0 for _, b0, b1 in steps)
        stray = int(np.count_nonzero((t < steps[0][1] - longest) | (t > steps[-1][2] + longest)))
        if stray:
            warnings.append(f"{os.path.basename(path)}: {stray} of {len(t)} hook records are timed more than a step outside the "
                            "profiled steps (damaged file?): left out")
    _unhooked_layers(records, steps, os.path.basename(path), warnings)
    spans = [(step, b0, b1, _partition(records[(t >= b0) & (t <= b1)], b0, b1, layers, comm, grad_bytes)) for step, b0, b1 in steps]
    trace = _to_rank_trace(f, path, spans, comm, layers)
    trace.meta.warnings, trace.meta.comm_source, trace.meta.kineto = warnings_of(warnings), comm.source, kpath
    trace.meta.unseen_collectives = comm.unseen
    trace.meta.fsdp = f.fsdp
    return trace


def _unhooked_layers(records: np.ndarray, steps: list[tuple[int, int, int]], name: str, warnings: list[str]) -> None:
    """Say when gradients were accumulated in the window but no layer's forward or backward hook ran: modules that run
    inside ``torch.compile``'s graphs do not call their hooks, so the steps' compute is gaps named ``other:*`` only."""
    if not steps:
        return
    code, t = records[:, Col.CODE], records[:, Col.T_NS]
    inside = (t >= steps[0][1]) & (t <= steps[-1][2])
    grads = int(np.count_nonzero(inside & (code == Rec.GRAD_READY)))
    if grads and not np.any(inside & np.isin(code, [Rec.FWD_BEGIN, Rec.BWD_BEGIN])):
        warnings.append(f"{name}: {grads} gradients were accumulated in its {len(steps)} profiled steps but no layer's forward or "
                        "backward hook ran (a model under torch.compile: its graphs run the modules without their hooks): forward "
                        "and backward are gaps named other:*, so re-bucketing, --no-overlap, --data-parallel and optimize "
                        "cannot be predicted, and link and worker what-ifs keep each all-reduce where it was issued")


def _check_step_times(f: RankFile, path: str) -> None:
    """The loop's step times (``step_times_ns``) judge the profiler's own cost (``passes.profiler_cost``): the collector
    times every step it profiles, each ending after it begins; anything else is damage, never a cost of 0 or below."""
    backwards = [s for s, t0, t1 in f.step_times_ns if t1 < t0 or t0 <= 0]
    if backwards:
        raise DagprofError(f"{len(backwards)} step time(s) in step_times_ns end before they begin or start at no time "
                           f"(step {backwards[0]}): a damaged file", path)
    untimed = sorted(set(f.steps_profiled) - {s for s, _, _ in f.step_times_ns})
    if untimed:
        raise DagprofError(f"{len(untimed)} profiled step(s) have no time in step_times_ns (step {untimed[0]}): a damaged file", path)


def _blocked_in(spans: list[_Span], k: int, end_ns: int | None) -> int | None:
    """The main-lane span after ``k`` that waited for a transfer ending at ``end_ns``: the gap in which
    it ended (the thread was blocked there), else the first span that starts after it (no delay)."""
    if end_ns is None:
        return k + 1 if k + 1 < len(spans) else None
    during = next((j for j in range(k + 1, len(spans)) if spans[j].end >= end_ns), None)
    if during is not None and spans[during].kind == Kind.OTHER:
        return during
    return next((j for j in range(k + 1, len(spans)) if spans[j].start >= end_ns), None)


def _hook_comm(records: np.ndarray) -> _Comm:
    """Fallback without Kineto: the comm hook's issue -> completion span (includes queueing and waiting for peers)."""
    code = records[:, Col.CODE]
    issued = {int(r[Col.B]): (int(r[Col.A]), int(r[Col.T_NS]), int(r[Col.X])) for r in records[code == Rec.ENQ_END]}
    transfers = []
    for r in records[code == Rec.COMM_DONE]:
        seq = int(r[Col.B])
        if seq in issued:
            bucket, t0, nbytes = issued[seq]
            transfers.append(_Transfer(seq, bucket, f"allreduce bucket {bucket}", t0, int(r[Col.T_NS]), f"comm thread {int(r[Col.X])}", nbytes))
    return _Comm("comm hook (issue to completion, includes queueing)", sorted(transfers, key=lambda t: t.seq), {}, [])


def _kineto_comm(kpath: str, rank: int, records: np.ndarray, steps: list, warnings: list) -> _Comm | None:
    """Transfers as Kineto saw them on the gloo/NCCL lanes; all-reduces matched to hook buckets in issue order."""
    from .kineto import read_kineto  # noqa: PLC0415  (only runs with Kineto on)

    kt = read_kineto(kpath, rank=rank)
    warnings += kt.meta.warnings  # what its reader noticed (events dropped and counted) is said with the rank's own
    ev = kt.events
    lo, hi = steps[0][1], steps[-1][2]
    at = lambda us: kt.base_ns + int(round(us * 1e3))  # noqa: E731
    colls = kt.meta.collectives.by_event() if kt.meta.collectives is not None else {}
    idx = [i for i in np.flatnonzero(ev.kind == Kind.COMM).tolist() if lo <= at(ev.start[i]) <= hi]
    idx.sort(key=lambda i: ev.start[i])
    code = records[:, Col.CODE]
    enq = sorted((int(r[Col.B]), int(r[Col.A]), int(r[Col.T_NS]), int(x[Col.X])) for r, x in
                 zip(records[code == Rec.ENQ_BEGIN], records[code == Rec.ENQ_END]))
    transfers, seq_of, used = [], {}, set()
    k = 0
    allreduce = [i for i in idx if colls.get(i, "").replace("_", "") == "allreduce"]
    for seq, bucket, t0, nbytes in enq:
        while k < len(allreduce) and at(ev.start[allreduce[k]]) < t0:
            k += 1
        if k == len(allreduce):
            warnings.append(f"rank {rank}: Kineto shows fewer all-reduces than the comm hook issued; transfer spans from the hook")
            return None
        i = allreduce[k]
        k += 1
        used.add(i)
        seq_of[seq] = int(ev.seq[i])
        lane = kt.lanes[ev.lane[i]]
        transfers.append(_Transfer(int(ev.seq[i]), bucket, f"allreduce bucket {bucket}", at(ev.start[i]),
                                   at(ev.start[i] + ev.dur[i]), lane.name, nbytes, _comm_lane_kind(lane)))
    for i in idx:
        if i not in used:
            name, lane = colls.get(i) or ev.name_of(i), kt.lanes[ev.lane[i]]
            transfers.append(_Transfer(int(ev.seq[i]), -1, name, at(ev.start[i]), at(ev.start[i] + ev.dur[i]),
                                       lane.name, int(ev.nbytes[i]), _comm_lane_kind(lane)))
    main = [j for j, lane in enumerate(kt.lanes) if lane.main]
    host = []
    if main:
        mask = (ev.kind == Kind.COMM_ENQUEUE) & (ev.depth == 0) & (ev.lane == main[0]) & (ev.seq >= 0)
        hooked = set(seq_of.values())
        for j in np.flatnonzero(mask).tolist():
            if int(ev.seq[j]) not in hooked and lo <= at(ev.start[j]) <= hi:
                host.append(_Span(Kind.COMM_ENQUEUE, ev.name_of(j), at(ev.start[j]), at(ev.start[j] + ev.dur[j]), seq=int(ev.seq[j])))
    kept = {h.seq for h in host}
    unseen = Counter(colls.get(i, "") or ev.name_of(i) for i in idx if i not in used and int(ev.seq[i]) not in kept)
    return _Comm("Kineto (gloo/NCCL execution spans)", sorted(transfers, key=lambda t: t.seq), seq_of, host,
                 _device_ops(kt, lo, hi, at), dict(unseen))


def _device_ops(kt: RankTrace, lo: int, hi: int, at) -> list[_DeviceOp]:
    """GPU compute and copies launched inside the window, with their launch and sync times."""
    ev = kt.events
    gpu = np.array([lane.kind == LaneKind.GPU_STREAM for lane in kt.lanes], dtype=bool)
    if not gpu.any():
        return []
    on_gpu = gpu[ev.lane]
    launch: dict[int, int] = {}
    sync: dict[int, int] = {}
    for src, dst in kt.flows.tolist():
        if on_gpu[dst] and not on_gpu[src]:
            launch[dst] = at(ev.start[src])
        elif on_gpu[src] and not on_gpu[dst]:
            sync.setdefault(src, at(ev.start[dst] + ev.dur[dst]))
    ops = []
    for i in np.flatnonzero(on_gpu & (ev.kind != Kind.COMM) & (ev.depth == 0)).tolist():
        t0 = launch.get(i, at(ev.start[i]))
        if lo <= t0 <= hi:
            ops.append(_DeviceOp(ev.name_of(i), Kind(int(ev.kind[i])), at(ev.start[i]), at(ev.start[i] + ev.dur[i]),
                                 kt.lanes[ev.lane[i]].name, launch.get(i, -1), sync.get(i, -1)))
    return ops


def _comm_lane_kind(lane: Lane) -> LaneKind:
    return LaneKind.GPU_STREAM if lane.kind == LaneKind.GPU_STREAM else LaneKind.COMM_THREAD


def _steps(records: np.ndarray) -> list[tuple[int, int, int]]:
    begins = {int(r[Col.A]): int(r[Col.T_NS]) for r in records if r[Col.CODE] == Rec.STEP_BEGIN}
    ends = {int(r[Col.A]): int(r[Col.T_NS]) for r in records if r[Col.CODE] == Rec.STEP_END}
    return [(s, begins[s], ends[s]) for s in sorted(begins) if s in ends]


def _partition(rows: np.ndarray, begin: int, end: int, layers: list[str], comm: _Comm, grad_bytes: list[int]) -> list[_Span]:
    code, a, b, t, x = (rows[:, c] for c in Col)
    priority = [h for h in comm.host if begin <= h.start <= end]  # intervals that cut through layer spans
    enq = {int(b[i]): int(t[i]) for i in np.flatnonzero(code == Rec.ENQ_BEGIN)}
    for i in np.flatnonzero(code == Rec.ENQ_END):
        s = int(b[i])
        if s in enq:
            priority.append(_Span(Kind.COMM_ENQUEUE, f"allreduce bucket {int(a[i])}", enq[s], int(t[i]), bucket=int(a[i]),
                                  seq=comm.seq_of.get(s, s), nbytes=int(x[i])))
    for kb, ke, kind, name in ((Rec.UPDATE_BEGIN, Rec.UPDATE_END, Kind.UPDATE, "optimizer.step"),
                               (Rec.WAIT_BEGIN, Rec.WAIT_END, Kind.COMM_WAIT, "ddp finalize (wait for buckets)"),
                               (Rec.DATA_BEGIN, Rec.DATA_END, Kind.DATA, "dataloader next")):
        for s0, s1 in zip(t[code == kb], t[code == ke]):
            priority.append(_Span(kind, name, int(s0), int(s1)))
    return _carve(sorted(priority, key=lambda s: s.start), _layer_spans(code, a, b, t, layers, grad_bytes), begin, end)


def _layer_spans(code, a, b, t, layers: list[str], grad_bytes: list[int]) -> list[_Span]:
    """One FORWARD and one BACKWARD span per (layer, call).

    Backward of a call starts when a gradient w.r.t. one of its outputs arrives and ends at
    the last of: gradient w.r.t. an input, its parameters' gradient accumulation (the first
    layer's input needs no gradient; only the accumulation marks its end).
    """
    spans = []
    fwd0 = {(int(a[i]), int(b[i])): int(t[i]) for i in np.flatnonzero(code == Rec.FWD_BEGIN)}
    for i in np.flatnonzero(code == Rec.FWD_END):
        key = (int(a[i]), int(b[i]))
        if key in fwd0:
            spans.append(_Span(Kind.FORWARD, f"{layers[key[0]]} forward", fwd0[key], int(t[i]), layer=key[0]))
    bwd0: dict[tuple[int, int], int] = {}
    bwd1: dict[tuple[int, int], int] = {}
    for i in np.flatnonzero(code == Rec.BWD_BEGIN):
        key = (int(a[i]), int(b[i]))
        bwd0[key] = min(bwd0.get(key, int(t[i])), int(t[i]))
    for i in np.flatnonzero(code == Rec.BWD_END):
        key = (int(a[i]), int(b[i]))
        bwd1[key] = max(bwd1.get(key, int(t[i])), int(t[i]))
    for i in np.flatnonzero(code == Rec.GRAD_READY):  # accumulation is once per step: the call whose backward ran last (call 0)
        key = (int(a[i]), 0)
        bwd1[key] = max(bwd1.get(key, int(t[i])), int(t[i]))
    for key, s0 in bwd0.items():
        nbytes = grad_bytes[key[0]] if key[1] == 0 else 0  # a layer's gradient is accumulated once per step
        spans.append(_Span(Kind.BACKWARD, f"{layers[key[0]]} backward", s0, max(s0, bwd1.get(key, s0)), layer=key[0], nbytes=nbytes))
    spans.sort(key=lambda s: (s.start, s.end))
    # hooks on one tensor fire back to back, so a span may end a few us after the next begins: clip
    return [
        s if k + 1 == len(spans) or s.end <= spans[k + 1].start else _Span(s.kind, s.name, s.start, spans[k + 1].start, s.layer, nbytes=s.nbytes)
        for k, s in enumerate(spans)
    ]


def _carve(priority: list[_Span], layer_spans: list[_Span], begin: int, end: int) -> list[_Span]:
    """Partition [begin, end]: priority spans win; a layer span keeps its first piece; gaps become OTHER."""
    out: list[_Span] = []
    cursor = begin
    pi = 0
    phase = "pre-forward"

    def gap(upto: int) -> None:
        nonlocal cursor
        if upto > cursor:
            out.append(_Span(Kind.OTHER, f"other:{phase}", cursor, upto))
            cursor = upto

    def flush_priority(upto: int) -> None:
        nonlocal pi, cursor, phase
        while pi < len(priority) and priority[pi].start < upto:
            p = priority[pi]
            pi += 1
            if p.end <= cursor:
                continue
            gap(p.start)
            out.append(_Span(p.kind, p.name, max(cursor, p.start), p.end, p.layer, p.bucket, p.seq, p.nbytes))
            cursor = p.end
            if p.kind == Kind.COMM_WAIT:
                phase = "post-backward"
            elif p.kind == Kind.UPDATE:
                phase = "post-update"

    for s in layer_spans:
        flush_priority(s.start)
        if s.end <= cursor:
            continue
        if s.kind == Kind.BACKWARD and phase in ("forward", "pre-forward"):
            phase = "loss"
        gap(s.start)
        piece_end = s.end
        if pi < len(priority) and priority[pi].start < piece_end:
            piece_end = priority[pi].start
        out.append(_Span(s.kind, s.name, max(cursor, s.start), piece_end, s.layer, nbytes=s.nbytes))
        cursor = piece_end
        phase = "forward" if s.kind == Kind.FORWARD else "backward"
        flush_priority(s.end)
    flush_priority(end + 1)
    gap(end)
    return [s for s in out if s.end > s.start or s.kind == Kind.COMM_ENQUEUE]


def _add_device_ops(device: list[_DeviceOp], rows: EventRows, add, lanes: list[Lane], base_ns: int) -> None:
    """GPU ops on their stream lanes; the main-lane event around the launch (sync) gives the flow, step, layer and kind."""
    if not device:
        return
    cols = rows.columns()  # the host rows, which the device ops added after them leave as they are
    main = np.flatnonzero((cols["lane"] == 0) & (cols["depth"] == 0))
    main = main[np.argsort(cols["start"][main], kind="stable")]
    starts = cols["start"][main]

    def around(t_ns: int) -> int | None:
        if t_ns < 0 or not len(main):
            return None
        k = int(np.searchsorted(starts, (t_ns - base_ns) / 1e3, side="right")) - 1
        if k < 0:
            return None
        i = int(main[k])
        return i if (t_ns - base_ns) / 1e3 <= cols["start"][i] + cols["dur"][i] else None

    lane_of = {lane.name: k for k, lane in enumerate(lanes) if k}  # a stream may already carry collectives
    for op in device:
        if op.lane not in lane_of:
            lane_of[op.lane] = len(lanes)
            lanes.append(Lane(op.lane, LaneKind.GPU_STREAM))
        host = around(op.launch)
        kind, step, layer = op.kind, -1, -1
        if host is not None:
            step, layer = int(cols["step"][host]), int(cols["layer"][host])
            if cols["kind"][host] in (Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE):
                kind = Kind(int(cols["kind"][host]))
        i = add(op.name, kind, lane_of[op.lane], op.start, op.end, step, layer)
        if host is not None:
            rows.flows.append((host, i))
        waiter = around(op.sync)
        if waiter is not None:
            rows.flows.append((i, waiter))


def _to_rank_trace(f: RankFile, path: str, steps: list, comm: _Comm, layers: list[str]) -> RankTrace:
    base_ns = min(b for _, b, _, _ in steps)
    rows = EventRows()

    def add(name: str, kind: Kind, lane: int, t0: int, t1: int, step: int, layer: int = -1, nbytes: int = 0,
            seq: int = -1, bucket: int = -1, depth: int = 0) -> int:
        """A span in ns of the rank's clock; a collective (``seq``) is of the run's one group."""
        return rows.add(name, kind, lane, (t0 - base_ns) / 1e3, (t1 - t0) / 1e3, depth=depth, step=step, layer=layer,
                        nbytes=nbytes, group=0 if seq >= 0 else -1, seq=seq, bucket=bucket)

    lanes = [Lane(f"thread {f.pid} (main)", LaneKind.CPU_THREAD, main=True)]
    comm_lanes = sorted({(t.lane, t.lane_kind) for t in comm.transfers})
    lane_of = {name: 1 + k for k, (name, _) in enumerate(comm_lanes)}
    lanes += [Lane(name, kind) for name, kind in comm_lanes]
    enqueue_ev: dict[int, int] = {}  # seq -> host event
    after_ev: dict[int, int] = {}  # seq -> the main-lane event that needs the transfer
    step_of: dict[int, int] = {}
    transfer_end = {t.seq: t.end for t in comm.transfers}
    for step, b0, b1, spans in steps:
        add(f"ProfilerStep#{step}", Kind.STEP, 0, b0, b1, step, depth=-1)
        # A host collective (DDP's buffer broadcast) is issued asynchronously and waited for later: the
        # main thread is blocked in the gap during which its transfer ends. That gap is the wait.
        blocked = {k: _blocked_in(spans, k, transfer_end.get(s.seq)) for k, s in enumerate(spans) if s.kind == Kind.COMM_ENQUEUE and s.bucket < 0}
        waits = {w for w in blocked.values() if w is not None and spans[w].kind == Kind.OTHER}
        ids = [add(f"{s.name} (blocked on a collective)" if k in waits else s.name, Kind.COMM_WAIT if k in waits else s.kind, 0,
                   s.start, s.end, step, s.layer, s.nbytes, s.seq, s.bucket)
               for k, s in enumerate(spans)]
        # the last backward's wait (earlier ones are gradient-accumulation passes without communication)
        sink = next((i for i, s in zip(ids[::-1], spans[::-1]) if s.kind == Kind.COMM_WAIT), None)
        sink = sink if sink is not None else next((i for i, s in zip(ids, spans) if s.kind == Kind.UPDATE), None)
        for k, (i, s) in enumerate(zip(ids, spans)):
            if s.kind != Kind.COMM_ENQUEUE:
                continue
            enqueue_ev[s.seq], step_of[s.seq] = i, step
            # a bucket all-reduce is needed by the step's wait; a host collective where the thread blocked on it
            target = sink if s.bucket >= 0 else (ids[blocked[k]] if blocked[k] is not None else None)
            if target is not None:
                after_ev[s.seq] = target
    _add_device_ops(comm.device, rows, add, lanes, base_ns)
    for t in comm.transfers:
        if t.seq not in enqueue_ev:
            continue
        i = add(t.name, Kind.COMM, lane_of[t.lane], t.start, t.end, step_of[t.seq], nbytes=t.nbytes, seq=t.seq, bucket=t.bucket)
        rows.flows.append((enqueue_ev[t.seq], i))
        if t.seq in after_ev:
            rows.flows.append((i, after_ev[t.seq]))
    ddp_ranks = list(f.ddp_group_ranks) or list(range(f.world_size))
    group = "0" if len(ddp_ranks) == f.world_size else "ddp " + ",".join(map(str, ddp_ranks))  # a mesh's DP group: matched within it
    groups, group_ranks, collectives = ([group], {group: ddp_ranks}, None) if f.fsdp is None else label_groups(rows, f.fsdp)
    profiled = set(f.steps_profiled)
    step_times = {s: (t1 - t0) / 1e3 for s, t0, t1 in f.step_times_ns}
    meta = RankMeta(
        format=RANK_FORMAT,
        pid=f.pid,
        cpus=f.cpus,
        torch=f.torch,
        mode=f.mode,
        bucket_cap_mb=f.bucket_cap_mb,
        ddp_models=f.ddp_models,
        comm_hook=f.comm_hook,
        steps_requested=list(f.steps_requested),
        steps_profiled=f.steps_profiled,
        steps_completed=f.steps_completed,
        step_times_us={s: d for s, d in step_times.items() if s in profiled},
        unprofiled_step_times_us={s: d for s, d in step_times.items() if s not in profiled},
        comm_lanes=[name for name, _ in comm_lanes],
        layer_grad_bytes=f.layer_grad_bytes,
        layer_saved_bytes=f.layer_saved_bytes,  # activations each layer keeps for backward
        collectives=collectives,
    )
    return RankTrace(
        rank=f.rank, world_size=f.world_size, source=path, events=rows.table(), lanes=lanes,
        base_ns=base_ns, host=f.host, backend=f.backend, layers=layers, groups=groups, group_ranks=group_ranks,
        flows=rows.flow_array(), buckets=f.bucket_layouts[-1] if f.bucket_layouts else (), meta=meta,
    )
