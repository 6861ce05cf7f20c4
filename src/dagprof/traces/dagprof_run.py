"""Reader of dagprof's own run folders (written by ``dagprof.collect``).

A run folder holds ``manifest.json`` (job-wide: world size, requested steps) and, per
rank, ``rank<R>.json`` (hook records, bucket layouts, step times, clock, host info) and
optionally ``rank<R>.kineto.json.gz`` (the torch.profiler trace of the same window).
Every file is written atomically, so a folder is readable while other ranks still write.

Hook records are raw timestamps ``[code, a, b, t_ns, x]`` (see ``Rec``); this module turns
them into the event-table conventions of ``events.py``. The main-thread lane of every
profiled step is partitioned completely by depth-0 events: one FORWARD and one BACKWARD
node per leaf-module call, COMM_ENQUEUE per bucket all-reduce call, COMM_WAIT for DDP's
end-of-backward wait, UPDATE for the optimizer, and OTHER for every remaining gap (named
by phase, e.g. ``other:pre-forward`` = data loading, zero_grad, DDP buffer broadcast).
A STEP event spans each step as a transparent wrapper (like ``ProfilerStep#N``).
"""
from __future__ import annotations

import enum
import gzip
import json
import os
from dataclasses import dataclass

import numpy as np

from ..errors import DagprofError
from .events import Bucket, EventTable, Kind, Lane, LaneKind, RankTrace, Run

FORMAT = "dagprof-run"
RANK_FORMAT = "dagprof-rank"
VERSION = 1
MANIFEST = "manifest.json"


def rank_file(rank: int) -> str:
    return f"rank{rank}.json"


def kineto_file(rank: int) -> str:
    return f"rank{rank}.kineto.json.gz"


class Rec(enum.IntEnum):
    """Record codes; ``a``/``b``/``x`` meaning per code."""

    STEP_BEGIN = 0  # a=step
    STEP_END = 1  # a=step
    FWD_BEGIN = 2  # a=layer, b=call index of that layer in the step
    FWD_END = 3  # a=layer, b=call
    BWD_BEGIN = 4  # a=layer, b=call: gradient w.r.t. an output arrived
    BWD_END = 5  # a=layer, b=call: gradient w.r.t. an input computed
    GRAD_READY = 6  # a=layer: a parameter's gradient was accumulated
    ENQ_BEGIN = 7  # a=bucket, b=seq: comm hook entered
    ENQ_END = 8  # a=bucket, b=seq, x=bytes: all-reduce issued
    COMM_DONE = 9  # a=bucket, b=seq, x=native thread id that completed it
    UPDATE_BEGIN = 10  # optimizer.step entered
    UPDATE_END = 11
    WAIT_BEGIN = 12  # autograd's end-of-backward callbacks start (DDP waits for buckets)
    WAIT_END = 13  # DDP's finalize done


@dataclass(frozen=True)
class _Span:
    kind: Kind
    name: str
    start: int  # ns
    end: int
    layer: int = -1
    bucket: int = -1
    seq: int = -1
    nbytes: int = 0


def _load_json(path: str) -> dict:
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise DagprofError("file is missing", path) from None
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as err:
        raise DagprofError(f"corrupt or truncated file ({type(err).__name__})", path) from None
    if not isinstance(data, dict):
        raise DagprofError("corrupt file (top level is not an object)", path)
    return data


def read_manifest(path: str | os.PathLike[str]) -> dict:
    folder = os.fspath(path)
    mpath = os.path.join(folder, MANIFEST)
    if not os.path.isdir(folder) or not os.path.exists(mpath):
        raise DagprofError(f"not a dagprof run folder (no {MANIFEST})", folder)
    manifest = _load_json(mpath)
    if manifest.get("format") != FORMAT:
        raise DagprofError(f"not a dagprof run folder ({MANIFEST} format is {manifest.get('format')!r})", mpath)
    if manifest.get("version", 0) > VERSION:
        raise DagprofError(f"written by a newer dagprof (format version {manifest['version']})", mpath)
    return manifest


def read_run(path: str | os.PathLike[str], require_ddp: bool = False) -> Run:
    """Read every rank of a run folder; missing, corrupt or empty ranks are one-line errors.

    A job that was not DDP-wrapped reads fine (compute only) with ``meta["ddp"] = False``
    and a warning; ``require_ddp=True`` turns that into an error.
    """
    folder = os.fspath(path)
    manifest = read_manifest(folder)
    world = int(manifest["world_size"])
    ranks = []
    for r in range(world):
        rpath = os.path.join(folder, rank_file(r))
        if not os.path.exists(rpath):
            raise DagprofError(f"rank {r} of {world} is missing (no {rank_file(r)}): it crashed, was killed, or is still running", folder)
        ranks.append(read_rank(rpath))
    warnings = [w for t in ranks for w in t.meta["warnings"]]
    ddp = any(t.buckets for t in ranks)
    if not ddp:
        msg = "no DDP gradient buckets were seen: not a DDP job (compute only, no communication)"
        if require_ddp:
            raise DagprofError(msg, folder)
        warnings.append(msg)
    meta = {**manifest, "ddp": ddp, "warnings": sorted(set(warnings))}
    return Run(ranks=ranks, source=folder, meta=meta)


def read_rank(path: str) -> RankTrace:
    data = _load_json(path)
    if data.get("format") != RANK_FORMAT:
        raise DagprofError(f"not a dagprof rank file (format {data.get('format')!r})", path)
    try:
        records = np.asarray(data["records"], dtype=np.int64).reshape(-1, 5)
        first, stop = data["steps_requested"]
        profiled = [int(s) for s in data["steps_profiled"]]
        layers = list(data["layers"])
    except (KeyError, TypeError, ValueError) as err:
        raise DagprofError(f"corrupt rank file ({type(err).__name__}: {err})", path) from None
    run = os.path.dirname(path) or "."
    done = int(data.get("steps_completed", 0))
    ended = f"training ended after {done} steps (last step {done - 1})" if done else "training never completed a step"
    if not profiled:
        raise DagprofError(f"run {run}: steps {first}-{stop - 1} requested but {ended}", path)
    warnings = list(data.get("warnings", []))
    if len(profiled) < stop - first:
        warnings.append(f"run {run}: steps {first}-{stop - 1} requested but {ended}: steps {profiled[0]}-{profiled[-1]} profiled")
    spans = _main_spans(records, layers)
    comm = _comm_spans(records)
    kpath = data.get("kineto_file")
    comm_source = "comm hook completion (enqueue to completion, includes queueing)"
    if kpath:
        kpath = os.path.join(os.path.dirname(path), kpath)
        if not os.path.exists(kpath):
            raise DagprofError("rank file names a Kineto trace that is missing", kpath)
    trace = _to_rank_trace(data, path, spans, comm, layers)
    trace.meta.update(
        warnings=warnings,
        comm_source=comm_source,
        kineto=kpath,
    )
    return trace


def _steps(records: np.ndarray) -> list[tuple[int, int, int]]:
    begins = {int(r[1]): int(r[3]) for r in records if r[0] == Rec.STEP_BEGIN}
    ends = {int(r[1]): int(r[3]) for r in records if r[0] == Rec.STEP_END}
    return [(s, begins[s], ends[s]) for s in sorted(begins) if s in ends]


def _main_spans(records: np.ndarray, layers: list[str]) -> list[tuple[int, int, int, list[_Span]]]:
    """Per step: (step, begin, end, depth-0 spans partitioning [begin, end])."""
    out = []
    for step, begin, end in _steps(records):
        rows = records[(records[:, 3] >= begin) & (records[:, 3] <= end)]
        out.append((step, begin, end, _partition(rows, begin, end, layers)))
    return out


def _partition(rows: np.ndarray, begin: int, end: int, layers: list[str]) -> list[_Span]:
    code, a, b, t, x = (rows[:, i] for i in range(5))
    priority: list[_Span] = []  # intervals that cut through layer spans
    enq = {}
    for i in np.flatnonzero(code == Rec.ENQ_BEGIN):
        enq[int(b[i])] = int(t[i])
    for i in np.flatnonzero(code == Rec.ENQ_END):
        s = int(b[i])
        if s in enq:
            priority.append(_Span(Kind.COMM_ENQUEUE, f"allreduce bucket {int(a[i])}", enq[s], int(t[i]), bucket=int(a[i]), seq=s, nbytes=int(x[i])))
    for kb, ke, kind, name in ((Rec.UPDATE_BEGIN, Rec.UPDATE_END, Kind.UPDATE, "optimizer.step"),
                               (Rec.WAIT_BEGIN, Rec.WAIT_END, Kind.COMM_WAIT, "ddp finalize (wait for buckets)")):
        for s0, s1 in zip(t[code == kb], t[code == ke]):
            priority.append(_Span(kind, name, int(s0), int(s1)))
    layer_spans = _layer_spans(code, a, b, t, layers)
    return _carve(sorted(priority, key=lambda s: s.start), layer_spans, begin, end)


def _layer_spans(code, a, b, t, layers: list[str]) -> list[_Span]:
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
        spans.append(_Span(Kind.BACKWARD, f"{layers[key[0]]} backward", s0, max(s0, bwd1.get(key, s0)), layer=key[0]))
    spans.sort(key=lambda s: (s.start, s.end))
    # hooks on one tensor fire back to back, so a span may end a few us after the next begins: clip
    return [
        s if k + 1 == len(spans) or s.end <= spans[k + 1].start else _Span(s.kind, s.name, s.start, spans[k + 1].start, s.layer)
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
        out.append(_Span(s.kind, s.name, max(cursor, s.start), piece_end, s.layer))
        cursor = piece_end
        phase = "forward" if s.kind == Kind.FORWARD else "backward"
        flush_priority(s.end)
    flush_priority(end + 1)
    gap(end)
    return [s for s in out if s.end > s.start or s.kind == Kind.COMM_ENQUEUE]


def _comm_spans(records: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """(seq, bucket, enqueue_end_ns, done_ns, tid) per all-reduce in enqueue order."""
    code = records[:, 0]
    issued = {int(r[2]): (int(r[1]), int(r[3])) for r in records[code == Rec.ENQ_END]}
    out = []
    for r in records[code == Rec.COMM_DONE]:
        seq = int(r[2])
        if seq in issued:
            bucket, t0 = issued[seq]
            out.append((seq, bucket, t0, int(r[3]), int(r[4])))
    return sorted(out)


def _to_rank_trace(data: dict, path: str, steps, comm, layers: list[str]) -> RankTrace:
    base_ns = min(b for _, b, _, _ in steps)
    names: list[str] = []
    index: dict[str, int] = {}
    cols: dict[str, list] = {c: [] for c in ("name", "kind", "lane", "start", "dur", "depth", "step", "layer", "nbytes", "group", "seq", "bucket")}

    def add(name: str, kind: Kind, lane: int, t0: int, t1: int, step: int, layer=-1, nbytes=0, group=-1, seq=-1, bucket=-1,
            depth=0) -> int:
        if name not in index:
            index[name] = len(names)
            names.append(name)
        for c, v in (("name", index[name]), ("kind", int(kind)), ("lane", lane), ("start", (t0 - base_ns) / 1e3),
                     ("dur", (t1 - t0) / 1e3), ("depth", depth), ("step", step), ("layer", layer), ("nbytes", nbytes), ("group", group),
                     ("seq", seq), ("bucket", bucket)):
            cols[c].append(v)
        return len(cols["start"]) - 1

    lanes = [Lane(f"thread {data.get('pid', 0)} (main)", LaneKind.CPU_THREAD, main=True)]
    comm_tids = sorted({c[4] for c in comm})
    lane_of_tid = {tid: 1 + k for k, tid in enumerate(comm_tids)}
    lanes += [Lane(f"comm thread {tid}", LaneKind.COMM_THREAD) for tid in comm_tids]
    enqueue_ev: dict[int, int] = {}
    sink_ev: dict[int, int] = {}  # step -> the wait (or update) that needs the step's buckets
    step_of_seq: dict[int, int] = {}
    for step, b0, b1, spans in steps:
        add(f"ProfilerStep#{step}", Kind.STEP, 0, b0, b1, step, depth=-1)
        for s in spans:
            i = add(s.name, s.kind, 0, s.start, s.end, step, s.layer, s.nbytes, 0 if s.seq >= 0 else -1, s.seq, s.bucket)
            if s.kind == Kind.COMM_ENQUEUE:
                enqueue_ev[s.seq] = i
                step_of_seq[s.seq] = step
            elif s.kind == Kind.COMM_WAIT or (s.kind == Kind.UPDATE and step not in sink_ev):
                sink_ev[step] = i
    flows = []
    nbytes_of = {s.seq: s.nbytes for *_, spans in steps for s in spans if s.kind == Kind.COMM_ENQUEUE}
    for seq, bucket, t0, t1, tid in comm:
        if seq not in enqueue_ev:
            continue
        step = step_of_seq[seq]
        i = add(f"allreduce bucket {bucket}", Kind.COMM, lane_of_tid[tid], t0, t1, step, nbytes=nbytes_of[seq], group=0, seq=seq, bucket=bucket)
        flows.append((enqueue_ev[seq], i))
        if step in sink_ev:
            flows.append((i, sink_ev[step]))
    events = EventTable.from_columns(names, **cols)
    layouts = data.get("bucket_layouts", [])
    buckets = [Bucket(int(b["index"]), int(b["nbytes"]), list(b["params"])) for b in (layouts[-1] if layouts else [])]
    step_times = {int(s): int(t1) - int(t0) for s, t0, t1 in data.get("step_times_ns", [])}
    profiled = set(data["steps_profiled"])
    meta = {
        "pid": data.get("pid"),
        "torch": data.get("torch"),
        "bucket_cap_mb": data.get("bucket_cap_mb"),
        "steps_requested": data["steps_requested"],
        "steps_profiled": data["steps_profiled"],
        "steps_completed": data.get("steps_completed"),
        "step_times_us": {s: d / 1e3 for s, d in step_times.items() if s in profiled},
        "unprofiled_step_times_us": {s: d / 1e3 for s, d in step_times.items() if s not in profiled},
        "comm_lanes": [lanes[lane_of_tid[t]].name for t in comm_tids],
        "bucket_layout_changed": len(layouts) > 1,
        "kineto_on": bool(data.get("kineto_file")),
    }
    return RankTrace(
        rank=int(data["rank"]),
        world_size=int(data["world_size"]),
        source=path,
        events=events,
        lanes=lanes,
        base_ns=base_ns,
        host=data.get("host", ""),
        backend=data.get("backend", ""),
        layers=layers,
        groups=["0"],
        group_ranks={"0": list(range(int(data["world_size"])))},
        flows=np.asarray(flows, dtype=np.int64).reshape(-1, 2),
        buckets=buckets,
        meta=meta,
    )
