"""Stock torch.profiler (Kineto) traces -> ``RankTrace``: GPU and CPU, every schema generation.

Why it is shaped like this: a rank file has 10^5..10^6 events, so the reader
decodes typed structs (``kineto_schema``), turns them into numpy columns once,
and does per-name work (classification by regex) only once per distinct name.
The one sequential pass is the nesting walk per CPU thread (parents, depth,
inherited context), which is what lets kernels inherit FORWARD/BACKWARD from
the op that launched them and lets wrappers stay transparent.

The reader runs as named stages, each a function that returns a small frozen value
object the next stages read (``_header`` -> ``_columns`` -> ``_nest`` -> ``_kinds`` (their tables: ``kineto_tables``) ->
``kineto_deps.dependencies`` -> ``_collectives`` -> ``_rank_trace``); nothing is set
on the side, so the order of the calls in ``_build`` is visible in their arguments.

Conventions on top of ``events.py``:
- wrappers (``user_annotation`` ranges such as ``ProfilerStep#N``,
  ``DistributedDataParallel.forward``, ``Optimizer.step#...``, module ranges)
  get ``depth == -1``: they are not nodes; their children count from depth 0;
- flows join the exact events, each with the ``Dep`` rule that made it (see
  ``kineto_deps``); the graph builder splits depth-0 ops at nested endpoints;
- ``seq`` is the per-group position on this rank (``Seq`` when the trace has it),
  carried by both the transfer (kernel / gloo op) and its host enqueue;
- rank: ``distributedInfo.rank``, else the file name (``rank-3.json``,
  ``sampled_rank-1.json.gz``), else rank 0 when there is no ``distributedInfo`` at all
  (a single-process profile); ``meta.rank_source`` says which;
- ``meta.collectives`` holds, per transfer event, the collective its call ran
  (``CommKind``) and dtype (for cross-rank checks in ``dagprof.align``); ``meta.declined``
  counts, per rule, the inferred dependencies the measured timeline contradicted.
"""
from __future__ import annotations

import gc
import itertools
import operator
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable

import msgspec
import numpy as np

from ..errors import DagprofError
from . import kineto_schema as ks
from .comm_kind import P2P_PEERED
from .events import TIME_RESOLUTION_US, CommKind, EventRows, Kind, Lane, LaneKind, RankTrace
from .kineto_decode import MAX_OP_US, Reopened, TraceStream, open_trace, raw_value
from .kineto_deps import Deps, dependencies, enclosing_enqueue, main_lane, stream_number
from .kineto_tables import CONTEXT_KINDS, Columns, Kinds, Nesting
from .meta import Collectives, RankMeta, RunWarning
from .steps import cut_step

_NAME, _CAT, _PID, _TID, _TS, _DUR = (operator.attrgetter(f) for f in ("name", "cat", "pid", "tid", "ts", "dur"))
_FILE_RANK = re.compile(r"rank[-_]?(\d+)", re.I)


_CORR = operator.attrgetter("args.correlation")


def _corr(e: ks.Event) -> int:
    return e.args.correlation if e.args is not None else -1


def _corrs(xs: list[ks.Event], n: int) -> np.ndarray:
    """The events' correlation ids (-1 without arguments): in C, unless an event has no arguments (rare)."""
    try:
        return np.fromiter(map(_CORR, xs), np.int64, n)
    except AttributeError:
        return np.fromiter(map(_corr, xs), np.int64, n)


def read_kineto(path: str | os.PathLike[str], rank: int | None = None, world: int | None = None) -> RankTrace:
    """Parse one rank's Kineto trace (.json or .json.gz). ``rank`` overrides what the file says; ``rank`` and ``world``
    (a dagprof rank file's) must agree with its distributedInfo where that says them: else it is another rank's or job's."""
    path = os.fspath(path)
    was_enabled = gc.isenabled()
    gc.disable()  # 10^5 acyclic objects per chunk: collection passes would cost a third of the parse
    try:
        stream = open_trace(path)  # a Kineto trace read as it is decoded (its chunks raise a one-line DagprofError)
        try:
            out = _build(stream, path, rank, world)
        except Reopened as again:  # not readable as it streams in: read as decoded whole
            stream = again.stream
            out = _build(stream, path, rank, world)
        if stream.notes:
            out.meta.warnings.extend(msgspec.structs.replace(n, file=os.path.basename(path)) for n in stream.notes)
        return out
    finally:
        if was_enabled:
            gc.enable()


def _build(stream: TraceStream, path: str, rank: int | None, world: int | None = None) -> RankTrace:
    scan = _scan(stream)
    header = _header(stream.head, scan)
    cols = _columns(scan, path)
    nest = _nest(cols)
    kinds = _kinds(cols, nest)
    deps = dependencies(cols, nest, kinds, scan.syncs)
    colls = _collectives(cols, nest, deps, header)
    return _rank_trace(stream.head, path, (rank, world), header, cols, nest, kinds, deps, colls)


# ------------------------------------------------------------------ stage 1: the events, a chunk at a time
class _Interned:
    """Values -> ids in first-seen order across chunks, in one pass in C (a value not yet seen takes the next id)."""

    def __init__(self) -> None:
        self.ids: defaultdict[Any, int] = defaultdict(itertools.count().__next__)

    def __call__(self, values: Iterable[Any], n: int) -> np.ndarray:
        return np.fromiter(map(self.ids.__getitem__, values), np.int32, n)


@dataclass(frozen=True, eq=False)
class _Scan:
    """What one pass over the chunks keeps: per complete event (file order) its interned name, category,
    pid, tid, times and correlation; the few events whose arguments a later stage reads (``kept``, by
    file-order position); the metadata and CUDA sync events."""

    names: dict[str, int]
    cats: dict[str, int]
    pids: dict[Any, int]
    tids: dict[Any, int]
    name_id: np.ndarray
    cat_id: np.ndarray
    pid_id: np.ndarray
    tid_id: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    corr: np.ndarray
    kept: dict[int, ks.Event]
    infos: dict[tuple[int, int], ks.NameInfo]  # (name id, category id) -> its classification
    metas: list[ks.Event]
    syncs: list[ks.Event]


def _needs_args(info: ks.NameInfo) -> bool:
    """Rows whose arguments a later stage reads: collectives' records (group, seq, sizes) and copies (bytes)."""
    return bool(info.role) or info.kind == Kind.MEMCPY


def _scan(stream: TraceStream) -> _Scan:
    names, cats, pids, tids = _Interned(), _Interned(), _Interned(), _Interned()
    parts: list[tuple[np.ndarray, ...]] = []
    kept: dict[int, ks.Event] = {}
    infos: dict[tuple[int, int], ks.NameInfo] = {}
    metas, syncs = [], []
    offset = untimed = too_long = python_calls = 0
    skip = ks.SKIP_CATS
    for events in stream.chunks():
        metas += stream.detach([e for e in events if type(e) is ks.MetaEvent])
        xall = [e for e in events if type(e) is ks.Event]
        del events
        syncs += stream.detach([e for e in xall if e.cat == "cuda_sync"])
        python_calls += sum(e.cat == "python_function" for e in xall)
        xs = [e for e in xall if e.cat not in skip and type(e.pid) is int]
        del xall
        ts, dur = np.fromiter(map(_TS, xs), np.float64, len(xs)), np.fromiter(map(_DUR, xs), np.float64, len(xs))
        ok = (ts >= 0.0) & (dur >= 0.0) & (dur <= MAX_OP_US)  # NaN (missing) fails every comparison
        if not ok.all():
            long = int(((ts >= 0.0) & (dur > MAX_OP_US)).sum())
            too_long += long
            untimed += len(xs) - int(ok.sum()) - long
            xs = [e for e, keep in zip(xs, ok.tolist()) if keep]
            ts, dur = ts[ok], dur[ok]
        n = len(xs)
        nid, cid = names(map(_NAME, xs), n), cats(map(_CAT, xs), n)
        codes, inv = np.unique(nid.astype(np.int64) << 32 | cid, return_inverse=True)
        keys = [(c >> 32, c & 0xFFFFFFFF) for c in codes.tolist()]
        if any(key not in infos for key in keys):
            name_of, cat_of = list(names.ids), list(cats.ids)
            infos.update((key, ks.classify(cat_of[key[1]], name_of[key[0]])) for key in keys if key not in infos)
        flags = [_needs_args(infos[key]) for key in keys]
        rows = np.flatnonzero(np.array(flags, dtype=bool)[inv.reshape(-1)]).tolist()
        kept.update(zip((offset + i for i in rows), stream.detach([xs[i] for i in rows])))
        parts.append((nid, cid, pids(map(_PID, xs), n), tids(map(_TID, xs), n), ts, dur, _corrs(xs, n)))
        offset += n
        del xs
    stream.finish(offset, untimed, too_long, python_calls)
    stream.release()
    cols = [np.concatenate(c) if parts else np.zeros(0, t) for c, t in
            zip(zip(*parts) if parts else [()] * 7, (np.int32, np.int32, np.int32, np.int32, np.float64, np.float64, np.int64))]
    return _Scan(dict(names.ids), dict(cats.ids), dict(pids.ids), dict(tids.ids), *cols, kept=kept, infos=infos, metas=metas, syncs=syncs)


# ------------------------------------------------------------------ stage 1b: metadata
@dataclass(frozen=True)
class _Header:
    """What the trace says about its process: thread names and ``distributedInfo``."""

    thread_names: dict[tuple[Any, Any], str]
    dist: dict[str, Any]


def _header(head: ks.Head, scan: _Scan) -> _Header:
    """Thread names from the metadata events, and ``distributedInfo`` ({} when absent or not an object)."""
    names = {}
    for e in scan.metas:
        if e.name == "thread_name" and e.args is not None and len(e.args.name):
            names[(e.pid, e.tid)] = str(raw_value(e.args.name))
    info = raw_value(head.distributedInfo)
    return _Header(names, info if isinstance(info, dict) else {})


# ------------------------------------------------------------------ stage 2: columns
MAX_SPAN_US = 7 * 86_400e6  # a trace whose events spread over more than a week holds a corrupt timestamp
LATEST_START_NS = 4_102_444_800 * 10**9  # 2100-01-01: a trace that starts later has times in ns where Kineto writes us


def _columns(scan: _Scan, path: str) -> Columns:
    """Flat numpy columns of the complete events; early-Kineto category names read as today's."""
    n = len(scan.ts)
    name_id, cat_id = scan.name_id, scan.cat_id
    cat_ids = list(scan.cats)
    cats = [ks.OLD_CATS.get(c, c) for c in cat_ids]
    pair_keys, pair = np.unique(name_id.astype(np.int64) * len(cats) + cat_id, return_inverse=True)
    pair = pair.reshape(-1)
    cat_gpu = np.array([c in ks.GPU_CATS for c in cats], dtype=np.int64)
    pid, pids = _ordered_ids(scan.pid_id, list(scan.pids))
    tid, tids = _ordered_ids(scan.tid_id, list(scan.tids))  # usually ints, but the format allows strings
    lane_codes, lane = np.unique((cat_gpu[cat_id] * len(pids) + pid) * len(tids) + tid, return_inverse=True)
    lane = lane.reshape(-1)
    ts, dur = scan.ts, scan.dur
    order = np.lexsort((-dur, ts, lane))
    ts = ts[order]
    t0 = float(ts.min()) if n else 0.0
    span = float((ts + dur[order]).max()) - t0 if n else 0.0
    if span > MAX_SPAN_US:
        raise DagprofError(f"events span {span / 86_400e6:,.0f} days: a timestamp is corrupt (one profile spans seconds to hours)", path)
    lane_keys = [(bool(c // len(tids) // len(pids)), pids[c // len(tids) % len(pids)], tids[c % len(tids)]) for c in lane_codes.tolist()]
    lane_gpu = np.array([k[0] for k in lane_keys], dtype=bool)
    name_list = list(scan.names)
    lane_sorted = lane[order].astype(np.int32)
    return Columns(
        kept=scan.kept, orig=order, names=name_list,
        info=[scan.infos[(k // len(cats), k % len(cats))] for k in pair_keys.tolist()],
        pair=pair[order].astype(np.int32), pair_name=(pair_keys // len(cats)).astype(np.int32),
        pair_cat=[cat_ids[int(k) % len(cats)] for k in pair_keys.tolist()],
        lane=lane_sorted, lane_keys=lane_keys, start=ts - t0, dur=dur[order], t0=t0,
        is_gpu=lane_gpu[lane_sorted] if n else np.zeros(0, bool), corr=scan.corr[order],
    )


# ------------------------------------------------------------------ stage 3: nesting
def _nest(cols: Columns) -> Nesting:
    """Parents per CPU thread (``_parents``), then what each row inherits along its chain of parents, one
    vectorised step per nesting level (wrappers transparent)."""
    n = cols.n
    parent = np.full(n, -1, dtype=np.int64)
    level = np.zeros(n, dtype=np.int64)  # events open around the row on its thread: its depth counting wrappers
    bounds = np.searchsorted(cols.lane, np.arange(len(cols.lane_keys) + 1)).tolist()  # rows are in lane order
    start, end = cols.start, cols.end
    for lane_id, (gpu, _, _) in enumerate(cols.lane_keys):
        a, b = bounds[lane_id], bounds[lane_id + 1]
        if not gpu and b > a:
            _parents(start[a:b], end[a:b], parent[a:b], level[a:b], a)
    wrap = cols.per_event("wrapper", bool)
    own_ctx = cols.per_event("ctx", np.int8)
    nd = np.zeros(n, dtype=np.int64)  # non-wrapper events on the chain, the row included
    depth = np.zeros(n, dtype=np.int16)
    top = np.arange(n, dtype=np.int64)
    ctx = own_ctx.copy()
    order = np.argsort(level.astype(np.int32), kind="stable")
    cuts = np.cumsum(np.bincount(level)).tolist()
    roots = order[:cuts[0]]
    nd[roots] = ~wrap[roots]
    depth[roots] = np.where(wrap[roots], -1, 0)
    top[roots] = np.where(wrap[roots], -1, roots)
    for lo, hi in zip(cuts, cuts[1:]):
        rows = order[lo:hi]
        p, w = parent[rows], wrap[rows]
        k = nd[p]
        nd[rows] = k + ~w
        depth[rows] = np.where(w, -1, k)
        top[rows] = np.where(k > 0, top[p], np.where(w, -1, rows))
        ctx[rows] = np.where(ctx[rows] >= 0, ctx[rows], ctx[p])
    gpu = cols.is_gpu
    ctx[gpu], depth[gpu], top[gpu] = -1, 0, np.flatnonzero(gpu)
    del nd, order, level
    return Nesting(parent, depth, top, ctx, _innermost(parent, cols.has_role(ks.Role.ENQUEUE)))


def _parents(st: np.ndarray, en: np.ndarray, parent: np.ndarray, level: np.ndarray, base: int) -> None:
    """One thread's rows (by start, longest first): fills ``parent`` (a row index, -1 none) and ``level``.

    An event's parent is the latest earlier one still open at its start, an event that outlives its parent
    (by a rounding) being cut at the parent's end. Given the ends after the cuts, the parent is the latest
    earlier row one level up (``level``: the earlier rows not yet ended), found in numpy; the cuts are found
    by repeating until they no longer change (once or twice), and a walk with a stack of open events does it
    when they keep changing."""
    m = len(st)
    idx = np.arange(m)
    zero = np.concatenate(([0], np.cumsum(en == st)))
    same = zero[np.searchsorted(st, st, side="right")] - zero[idx]  # zero-length rows from this one on, with its start
    eff = en
    for _ in range(8):
        lv = idx - (np.searchsorted(np.sort(eff), st, side="right") - same)
        o = np.argsort(lv.astype(np.int32), kind="stable")  # by level, then row
        pos = np.searchsorted(lv[o] * m + o, (lv - 1) * m + idx) - 1
        p = o[np.maximum(pos, 0)]
        inner = lv > 0
        if lv.min() < 0 or not ((pos >= 0) & (lv[p] == lv - 1) | ~inner).all():
            break
        # exact when the ends are the cuts these parents make, and no cut end lies at or before its start
        # (the level count takes the rows at or after a row that end by its start to be zero-length ones)
        if np.array_equal(eff, np.where(inner, np.minimum(en, eff[p]), en)) and ((eff > st) | (en == st)).all():
            parent[inner] = p[inner] + base
            level[:] = lv
            return
        eff = en.copy()
        cuts = np.cumsum(np.bincount(lv)).tolist()
        for lo, hi in zip(cuts, cuts[1:]):  # parents first: one level at a time
            r = o[lo:hi]
            eff[r] = np.minimum(en[r], eff[p[r]])
    eff_end = en.tolist()
    stack: list[int] = []
    for i, s in enumerate(st.tolist()):
        while stack and eff_end[stack[-1]] <= s:
            stack.pop()
        if stack:
            q = stack[-1]
            parent[i] = q + base
            level[i] = len(stack)
            if eff_end[i] > eff_end[q]:
                eff_end[i] = eff_end[q]
        stack.append(i)


def _innermost(parent: np.ndarray, mark: np.ndarray) -> np.ndarray:
    """Per row, the nearest row on its parent chain (itself included) where ``mark`` holds, -1 none
    (pointer jumping: one vectorised step per nesting level)."""
    found = np.where(mark, np.arange(len(mark)), -1)
    up = parent.copy()
    todo = np.flatnonzero((found < 0) & (up >= 0))
    while len(todo):
        a = up[todo]
        hit = mark[a]
        found[todo[hit]] = a[hit]
        up[todo] = parent[a]
        todo = todo[~hit & (up[todo] >= 0)]
    return found


# ------------------------------------------------------------------ stage 4: kinds and steps
def _kinds(cols: Columns, nest: Nesting) -> Kinds:
    """Kinds and step numbers from the ``ProfilerStep#N`` windows and the launch correlations."""
    kind = cols.own_kind.copy()
    start, end = cols.start, cols.end
    is_step = kind == Kind.STEP
    step_no = cols.per_event("step", np.int32)
    s_idx = np.flatnonzero(is_step)  # step windows, from the STEP markers (one lane has them)
    s_idx = s_idx[np.argsort(start[s_idx], kind="stable")]
    s_start, s_end, s_num = start[s_idx], end[s_idx], step_no[s_idx]
    step = np.full(cols.n, -1, dtype=np.int32)
    if len(s_idx):
        k = np.searchsorted(s_start, start, side="right") - 1
        inside = (k >= 0) & (start < s_end[np.maximum(k, 0)])
        step[inside] = s_num[k[inside]]
        step[is_step] = s_num[np.searchsorted(s_start, start[is_step])]
    # forward: CPU work with no explicit context between a step's start and its first backward op
    ctx = nest.ctx.copy()
    cpu = ~cols.is_gpu
    if len(s_idx):
        slot = np.searchsorted(s_start, start, side="right") - 1
        in_step = cpu & (slot >= 0) & (step >= 0)
        bwd = in_step & ((ctx == Kind.BACKWARD) | (kind == Kind.BACKWARD))
        first_bwd = s_end.copy()
        np.minimum.at(first_bwd, slot[bwd], start[bwd])
        fwd = in_step & (ctx < 0) & (start < first_bwd[np.maximum(slot, 0)])
        ctx[fwd] = Kind.FORWARD
    take = cpu & (kind == Kind.OTHER) & np.isin(ctx, CONTEXT_KINDS)
    kind[take] = ctx[take]
    # GPU work: launched by the runtime call with the same correlation id (a graph launch releases many)
    own = cols.own_kind
    rt = np.flatnonzero(((own == Kind.RUNTIME) | (own == Kind.COMM_WAIT)) & cpu & (cols.corr >= 0))
    gpu = np.flatnonzero(cols.is_gpu & (cols.corr >= 0))
    launcher = np.full(cols.n, -1, dtype=np.int64)
    if len(rt) and len(gpu):
        o = np.argsort(cols.corr[rt], kind="stable")
        rc = cols.corr[rt][o]
        pos = np.minimum(np.searchsorted(rc, cols.corr[gpu]), len(rc) - 1)
        hit = rc[pos] == cols.corr[gpu]
        launcher[gpu[hit]] = rt[o][pos[hit]]
    launched = np.flatnonzero(launcher >= 0)
    lk = ctx[launcher[launched]]
    inherit = (kind[launched] == Kind.KERNEL) & np.isin(lk, CONTEXT_KINDS[:3])
    kind[launched[inherit]] = lk[inherit]
    step[launched] = step[launcher[launched]]  # a kernel belongs to the step that launched it, wherever it runs
    return Kinds(kind, step, launcher, ctx)


# ------------------------------------------------------------------ stage 6: collectives
@dataclass(frozen=True, eq=False)
class _Collectives:
    """Per row: process ``group`` (index into ``groups``), ``seq`` and payload ``nbytes``; plus the
    group table and what ``dagprof.align`` needs to check a match across ranks."""

    group: np.ndarray
    seq: np.ndarray
    nbytes: np.ndarray
    peer: np.ndarray  # a send's or recv's peer, as its group numbers it (``EventTable.peer``)
    comm_kind: np.ndarray  # ``EventTable.comm_kind``
    groups: list[str]
    group_ranks: dict[str, list[int]]
    group_desc: dict[str, str]  # process-group descriptions (pg_config, record_param_comms): "mesh_tp", "default_pg"
    meta: Collectives
    explicit_seq: bool


def _collectives(cols: Columns, nest: Nesting, deps: Deps, header: _Header) -> _Collectives:
    """Group, seq and bytes of every collective (transfer and its enqueue), and memcpy sizes."""
    n = cols.n
    group_ranks: dict[str, list[int]] = {}
    group_desc: dict[str, str] = {}
    for pg in header.dist.get("pg_config") or []:
        if isinstance(pg, dict) and "pg_name" in pg:
            group_ranks[str(pg["pg_name"])] = [int(r) for r in pg.get("ranks") or []]
            if isinstance(pg.get("pg_desc"), str):
                group_desc[str(pg["pg_name"])] = pg["pg_desc"]
    group = np.full(n, -1, dtype=np.int32)
    seq = np.full(n, -1, dtype=np.int64)
    nbytes = np.zeros(n, dtype=np.int64)
    peer = np.full(n, -1, dtype=np.int32)
    comm_kind = np.zeros(n, dtype=np.uint8)
    for i in np.flatnonzero(cols.own_kind == Kind.MEMCPY).tolist():
        a = cols.event(i).args
        nbytes[i] = a.nbytes if a is not None and a.nbytes > 0 else 0
    transfers = np.flatnonzero(deps.kind == Kind.COMM)
    meta_of: dict[int, list[int]] = {}  # host-side argument records, keyed by the enqueue (or depth-0 op) they sit in
    for i in np.flatnonzero(cols.has_role(ks.Role.META)).tolist():
        meta_of.setdefault(enclosing_enqueue(nest, i), []).append(i)
    coll_out, dtype_out, explicit = [], [], []
    gids: dict[str, int] = {}
    for t in transfers.tolist():
        enq = int(deps.enqueue_of[t])
        info = ks.collective_args([cols.event(r) for r in [t] + meta_of.get(enq, [])])
        # metadata, else the host call (c10d::alltoall_base_ launches a SendRecv kernel), else the kernel
        enq_coll = cols.info[cols.pair[enq]].coll if enq >= 0 else ""
        g = info.get("group", "0")
        group[t] = gids.setdefault(g, len(gids))
        nbytes[t] = info.get("nbytes", 0)
        seq[t] = info.get("seq", -1)
        explicit.append(seq[t] >= 0)
        if info.get("ranks") and g not in group_ranks:
            group_ranks[g] = info["ranks"]
        if info.get("desc"):
            group_desc.setdefault(g, info["desc"])
        wire = cols.info[cols.pair[t]].coll
        coll_out.append(CommKind.of(info.get("coll") or _host_coll(enq_coll, wire)))
        comm_kind[t] = CommKind.of(wire) if wire else coll_out[-1]  # what crossed the wire: gloo's reduce-scatter an all-reduce (``_host_coll``)
        if coll_out[-1] in P2P_PEERED:
            peer[t] = _peer(info, cols.event(enq) if CommKind.of(enq_coll) in P2P_PEERED else None, group_ranks.get(g, []))
        dtype_out.append(info.get("dtype", "") or ks.kernel_dtype(cols.event(t).name))
    # counted order per group, by issue time (the enqueue) when known
    enq = deps.enqueue_of[transfers]
    issue = np.where(enq >= 0, cols.start[np.maximum(enq, 0)], cols.start[transfers])
    if len(transfers) and not all(explicit):
        for g in range(len(gids)):
            mine = group[transfers] == g
            seq[transfers[mine][np.argsort(issue[mine], kind="stable")]] = np.arange(int(mine.sum()))
    has = enq >= 0
    group[enq[has]] = group[transfers[has]]
    seq[enq[has]] = seq[transfers[has]]
    nbytes[enq[has]] = nbytes[transfers[has]]
    peer[enq[has]] = peer[transfers[has]]
    comm_kind[enq[has]] = comm_kind[transfers[has]]
    return _Collectives(group, seq, nbytes, peer, comm_kind, list(gids), group_ranks, group_desc,
                        Collectives(event=transfers.tolist(), kind=coll_out, dtype=dtype_out), bool(explicit) and all(explicit))


def _host_coll(call: str, transfer: str) -> str:
    """The collective an instance runs: its call's (c10d::alltoall_base_ launches a SendRecv kernel), but gloo's
    ``_reduce_scatter_base_`` and ``reduce_scatter_tensor_coalesced_`` run a ``gloo:all_reduce`` of the whole input
    (FSDP2's reduce-scatter on CPU), and are priced as the all-reduce they are."""
    return transfer if call == "reducescatter" and transfer == "allreduce" else call or transfer


def _peer(info: dict[str, Any], call: ks.Event | None, ranks: list[int]) -> int:
    """A send's or recv's peer as its group numbers it: its record's (recent torch writes the group rank beside the global
    one, which must agree with the group's ranks), else the c10d::send/recv_ call's argument (gloo records no
    record_param_comms), else -1."""
    if "peer" in info:
        local = int(info["peer"])
        return local if not ranks or (local < len(ranks) and ranks[local] == info["peer_global"]) else -1
    return ks.scalar_input(call, 2) if call is not None else -1


# ------------------------------------------------------------------ stage 7: assembly
def _event_bytes(colls: _Collectives, group_ranks: dict[str, list[int]]) -> np.ndarray:
    """``colls.nbytes`` as the events carry them (``CommKind.event_bytes``): Kineto sizes a collective by its first input,
    an all-gather's one rank's chunk, which becomes the gathered total on its group's ranks (0, unknown, for a group of
    unknown ranks)."""
    out = colls.nbytes.copy()
    for i in np.flatnonzero((colls.comm_kind == CommKind.ALL_GATHER) & (colls.nbytes > 0)).tolist():
        out[i] = CommKind.ALL_GATHER.event_bytes(int(out[i]), len(group_ranks.get(colls.groups[colls.group[i]], ())))
    return out


def _identity(header: _Header, path: str, given: tuple[int | None, int | None]) -> tuple[int, int, str]:
    """(rank, world size, where the rank came from); ``given``: the rank and world size a dagprof rank file says (or None)."""
    rank_arg, world_arg = given
    dist = header.dist
    said = int(dist["rank"]) if str(dist.get("rank", "")).isdigit() else None  # an int, or "3" in some writers; -1: unknown
    if rank_arg is not None and said is not None and said != rank_arg:  # a dagprof rank file names another rank's trace
        raise DagprofError(f"distributedInfo says rank {said}, but it is read as rank {rank_arg}'s trace: "
                           "another rank's file (swapped or copied)", path)
    if rank_arg is not None:
        rank, source = int(rank_arg), "argument"
    elif said is not None:
        rank, source = said, "distributedInfo"
    else:
        m = _FILE_RANK.search(os.path.basename(path))
        if m:
            rank, source = int(m.group(1)), "file name"
        elif not dist:
            rank, source = 0, "assumed: no distributedInfo (single-process profile)"
        else:
            raise DagprofError("distributedInfo has no rank and the file name carries none (name it rank-N...json or pass rank=)", path)
    world = dist.get("world_size")
    if world_arg is not None and str(world).isdigit() and int(world) != world_arg:  # read before as the run's, exit 0
        raise DagprofError(f"distributedInfo says world_size {world}, but the rank file is of a {world_arg}-rank job: "
                           "another job's trace", path)
    if str(world).isdigit() and 0 < int(world) <= rank:  # was read as a job of rank + 1 ranks: "the traces disagree on the world size"
        raise DagprofError(f"rank {rank} (from the {source}) but distributedInfo says world_size {world}: a damaged or foreign trace", path)
    if not (str(world).isdigit() and int(world) > 0):
        sizes = [int(pg.get("pg_size", 0)) for pg in dist.get("pg_config") or [] if isinstance(pg, dict)]
        world = max(sizes + [rank + 1])
    return rank, max(int(world), rank + 1), source


def _rank_trace(trace: ks.Head, path: str, given: tuple[int | None, int | None], header: _Header, cols: Columns, nest: Nesting,
                kinds: Kinds, deps: Deps, colls: _Collectives) -> RankTrace:
    rank, world, source = _identity(header, path, given)
    numbers, count = np.unique(kinds.step[(deps.kind == Kind.STEP) & (kinds.step >= 0)], return_counts=True)
    if (count > 1).any():  # the step's ops were split between its windows and its collectives matched nothing on the other ranks
        raise DagprofError(f"ProfilerStep#{numbers[count > 1][0]} marks {count[count > 1][0]} windows: a damaged trace, or two "
                           "profiler sessions in one file (give one per file)", path)
    group_ranks = dict(colls.group_ranks)
    if "0" in colls.groups and "0" not in group_ranks:
        group_ranks["0"] = list(range(world))  # the default group spans the job
    nbytes = _event_bytes(colls, group_ranks)
    gathers = (colls.comm_kind == CommKind.ALL_GATHER) & (colls.nbytes > 0)
    rows = EventRows(cols.names)
    rows.add_block(name=cols.pair_name[cols.pair], kind=deps.kind, lane=cols.lane, start=cols.start, dur=cols.dur, depth=nest.depth,
                   step=kinds.step, nbytes=nbytes, group=colls.group, seq=colls.seq, peer=colls.peer, comm_kind=colls.comm_kind)
    base = trace.baseTimeNanoseconds or 0
    if base + cols.t0 * 1000.0 > LATEST_START_NS:  # read before as a run 1000x slower, exit 0
        year = 1970 + (base + cols.t0 * 1000.0) / 31_557_600e9
        raise DagprofError(f"its events start in the year {year:.0f}: times in ns where Kineto writes us (a converted or "
                           "hand-written trace?)", path)
    schema = raw_value(trace.schemaVersion)
    meta = RankMeta(format="kineto", rank_source=source, collectives=colls.meta, explicit_seq=colls.explicit_seq,
                    schema=schema if isinstance(schema, (int, str)) and not isinstance(schema, bool) else None,
                    declined=deps.declined, group_desc=colls.group_desc)
    is_step, end = deps.kind == Kind.STEP, cols.end
    # a Kineto ``ts`` of ~1.7e15 us parses to 0.25 us: a cut's ``ts + dur`` is its instant to two of those
    loop = np.where((cols.lane == main_lane(cols, deps.kind)) & (nest.depth == 0) & ~is_step, cols.pair_name[cols.pair], -1)
    meta.cut_step = cut_step(cols.start, end, is_step, kinds.step,
                             max(TIME_RESOLUTION_US, 2 * float(np.spacing(abs(cols.t0) + float(end.max(initial=0.0))))), loop,
                             np.isin(deps.kind, (Kind.BACKWARD, Kind.UPDATE)), cols.names)
    if unknown := int((gathers & (nbytes == 0)).sum()):  # ``_event_bytes``: the gathered total needs the group's ranks
        meta.warnings.append(RunWarning("all-gathers in process groups whose ranks the trace does not record: their gathered "
                                        "bytes are unknown (0), so a link or worker what-if prices them as empty messages",
                                        unknown, int(gathers.sum()), os.path.basename(path)))
    return RankTrace(
        rank=rank, world_size=world, source=path, events=rows.table(), lanes=_lanes(cols, nest, deps, header),
        base_ns=int(base + round(cols.t0 * 1000.0)), host=trace.host_name,
        backend=str(header.dist.get("backend", "")), groups=colls.groups, group_ranks=group_ranks,
        flows=np.stack([deps.src, deps.dst], axis=1), flow_rule=deps.rule, meta=meta,
    )


def _lanes(cols: Columns, nest: Nesting, deps: Deps, header: _Header) -> list[Lane]:
    """Named lanes; the main thread is the one with the step markers (else the busiest CPU thread)."""
    nl = len(cols.lane_keys)
    counts = np.bincount(cols.lane, minlength=nl)
    comm_only = np.bincount(cols.lane[(deps.kind == Kind.COMM) | (nest.depth < 0)], minlength=nl) == counts
    main = main_lane(cols, deps.kind)
    lanes = []
    for i, (is_gpu, pid, tid) in enumerate(cols.lane_keys):
        if is_gpu:
            lanes.append(Lane(f"GPU {pid} stream {stream_number(tid)}", LaneKind.GPU_STREAM))
            continue
        name = header.thread_names.get((pid, tid), f"thread {tid}")
        kind = LaneKind.COMM_THREAD if ("gloo" in name or comm_only[i]) and i != main else LaneKind.CPU_THREAD
        lanes.append(Lane(name, kind, main=i == main))
    return lanes


def _ordered_ids(ids: np.ndarray, table: list[Any]) -> tuple[np.ndarray, list[Any]]:
    """pid / tid ids in sorted order when they are all ints (the usual case), else in first-seen order."""
    try:
        arr = np.array(table, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return ids, table
    uniq, inv = np.unique(arr, return_inverse=True)
    return inv.reshape(-1).astype(np.int32)[ids], uniq.tolist()
