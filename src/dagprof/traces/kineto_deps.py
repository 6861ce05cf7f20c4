"""Intra-rank dependencies of a Kineto trace: one function per rule (``events.Dep``).

Each rule states what the CUDA/ROCm runtime or PyTorch guarantees and uses only what the trace
records: correlation ids (a launch and the GPU op it issued), call names, ``cuda_sync`` records
(newer Kineto: which stream or event a sync waits on) and the order in which the host issued work.
Where the trace does not name what a call waits for, a rule infers it from issue order, not from
the measured times it is later checked against: ``graph.provenance.violations`` counts, per rule, the
flows the measured timeline contradicts, which finds a wrong rule fast. Three rules do read measured
times, and are zero-violation by construction: a plain ``cudaStreamWaitEvent`` (no record names the
event) and the main thread's return from ``backward()`` are declined where the trace contradicts them
(``Deps.declined`` counts those); the autograd thread's first op follows the main thread's last op that
ended before it; an asynchronous pageable copy waits for its stream only if it outlived its copy's start.

Rules, in terms of the CUDA runtime API's synchronisation behaviour:
- LAUNCH: a GPU op runs after its launch call STARTED (a blocking call returns after its op ran);
- COPY: ``cudaMemcpy*`` into pageable host memory, or any synchronous ``cudaMemcpy``/``hipMemcpy``
  to the host, returns when the copy has ended: the call is a wait on its copy;
- STAGE: a copy from pageable host memory first drains its stream, then stages the data: the call
  waits for the op before the copy on its stream, and the rest of it is host work (an asynchronous
  call only when it outlived its copy's start: it may fit the staging buffer and not wait at all);
- SYNC: ``*StreamSynchronize`` / ``*DeviceSynchronize`` / ``*EventSynchronize`` wait for the last op
  issued before the call on the stream (all streams; the stream the event was recorded on);
- STREAM_WAIT / STREAM_WAIT_PLAIN / COLL_READY: cross-stream waits (below);
- ENQUEUE / COMM_WAIT: gloo's host collectives; BACKWARD_START / BACKWARD_END: the autograd thread.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from . import kineto_schema as ks
from .events import CLOCK_JITTER_US, Dep, Kind
from .kineto_tables import CONTEXT_KINDS, Columns, Kinds, Nesting

_EMPTY = np.empty(0, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class Deps:
    """The rank's flows (``src`` -> ``dst`` rows, each with its ``Dep`` rule), the final event kinds
    (a host wait that blocked on nothing takes its context's kind), each transfer's host enqueue,
    and how many inferred flows per rule the measured timeline contradicted (and so were left out)."""

    src: np.ndarray
    dst: np.ndarray
    rule: np.ndarray
    kind: np.ndarray
    enqueue_of: np.ndarray
    declined: dict[str, int]


def dependencies(cols: Columns, nest: Nesting, kinds: Kinds, syncs: list[ks.Event]) -> Deps:
    """Every rule's flows, deduplicated, plus what the rules decided about kinds and enqueues."""
    issued = Issued.of(cols, kinds)
    records = _sync_records(cols, syncs)
    kind = kinds.kind.copy()
    parts: list[tuple[Dep, np.ndarray, np.ndarray]] = []
    declined: dict[str, int] = {}
    launched = np.flatnonzero(kinds.launcher >= 0)
    parts.append((Dep.LAUNCH, kinds.launcher[launched], launched))
    parts += _blocking_copies(cols, kinds)
    parts.append((Dep.SYNC, *_host_syncs(cols, kinds, issued, records)))
    parts.append((Dep.STREAM_WAIT, *_recorded_stream_waits(cols, issued, records)))
    parts.append((Dep.COLL_READY, *_collective_ready(cols, nest, issued)))
    src, dst, n_declined = _plain_stream_waits(cols, nest, issued, records)
    parts.append((Dep.STREAM_WAIT_PLAIN, src, dst))
    if n_declined:
        declined[Dep.STREAM_WAIT_PLAIN.name] = n_declined
    enq, tr = _gloo_enqueues(cols)
    parts.append((Dep.ENQUEUE, enq, tr))
    parts.append((Dep.COMM_WAIT, *_host_comm_waits(cols, kind, kinds.ctx)))
    starts, ends, n_declined = _backward_thread(cols, nest, kind)
    parts.append((Dep.BACKWARD_START, *starts))
    parts.append((Dep.BACKWARD_END, *ends))
    if n_declined:
        declined[Dep.BACKWARD_END.name] = n_declined
    enqueue_of = np.full(cols.n, -1, dtype=np.int64)
    comm = launched[kind[launched] == Kind.COMM]
    r = kinds.launcher[comm]
    enqueue_of[comm] = np.where(nest.enqueue[r] >= 0, nest.enqueue[r], nest.top[r])
    enqueue_of[tr] = enq
    s, d, r = _merge(parts, cols.n)
    return Deps(s, d, r, kind, enqueue_of, declined)


def _merge(parts: list[tuple[Dep, np.ndarray, np.ndarray]], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Valid, distinct (src, dst, rule) rows sorted by (src, dst)."""
    src = np.concatenate([np.asarray(p[1], dtype=np.int64) for p in parts])
    dst = np.concatenate([np.asarray(p[2], dtype=np.int64) for p in parts])
    rule = np.concatenate([np.full(len(p[1]), int(p[0]), dtype=np.int64) for p in parts])
    ok = (src >= 0) & (dst >= 0) & (src != dst)
    key = distinct((src[ok] * n + dst[ok]) * 64 + rule[ok])  # one int key: dedup + sort (axis=0 unique is slow)
    pair, rule = key // 64, key % 64
    return pair // n, pair % n, rule.astype(np.int8)


def distinct(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)``: without its first call's import of ``numpy.ma``, a tenth of a small trace's cold load."""
    s = np.sort(a)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if len(s) else s


def enclosing_enqueue(nest: Nesting, i: int) -> int:
    """The host collective call (c10d::*) around event ``i``, else its depth-0 op."""
    e = int(nest.enqueue[i])
    return e if e >= 0 else int(nest.top[i])


# ---------------------------------------------------------------- issue order
@dataclass(frozen=True, eq=False)
class Issued:
    """GPU ops in the order the host issued them: the start of their launch call (their own start
    when no launch is recorded, as in sampled traces). Streams execute in this order, and a sync or
    an event record covers exactly the work issued before it."""

    op: np.ndarray  # GPU rows, by issue time
    at: np.ndarray  # issue time, ascending
    stream: np.ndarray  # lane of the op
    launch: np.ndarray  # row of the launch call, -1 unknown
    thread: np.ndarray  # lane of the launch call, -1 unknown
    comm: np.ndarray  # a collective's kernel

    @classmethod
    def of(cls, cols: Columns, kinds: Kinds) -> "Issued":
        gpu = np.flatnonzero(cols.is_gpu)
        launcher = kinds.launcher[gpu]
        has = launcher >= 0
        at = np.where(has, cols.start[np.maximum(launcher, 0)], cols.start[gpu])
        o = np.argsort(at, kind="stable")
        gpu, at, launcher, has = gpu[o], at[o], launcher[o], has[o]
        return cls(gpu, at, cols.lane[gpu], launcher, np.where(has, cols.lane[np.maximum(launcher, 0)], -1), kinds.kind[gpu] == Kind.COMM)

    def last_before(self, key: np.ndarray, q_key: np.ndarray, q_t: np.ndarray, among: np.ndarray | None = None) -> np.ndarray:
        """Per query, the last op with ``key == q_key`` issued strictly before ``q_t`` (-1 none)."""
        return _search(self.op, self.at, key, q_key, q_t, among, before=True)

    def first_after(self, key: np.ndarray, q_key: np.ndarray, q_t: np.ndarray, among: np.ndarray | None = None) -> np.ndarray:
        """Per query, the first op with ``key == q_key`` issued after ``q_t`` (-1 none)."""
        return _search(self.op, self.at, key, q_key, q_t, among, before=False)


def _search(op: np.ndarray, at: np.ndarray, key: np.ndarray, q_key: np.ndarray, q_t: np.ndarray,
            among: np.ndarray | None, before: bool) -> np.ndarray:
    out = np.full(len(q_t), -1, dtype=np.int64)
    q_key, q_t = np.asarray(q_key), np.asarray(q_t, dtype=np.float64)
    for k in distinct(q_key).tolist():
        sel = key == k
        if among is not None:
            sel &= among
        t, ops = at[sel], op[sel]
        q = np.flatnonzero(q_key == k)
        if not len(t):
            continue
        if before:
            pos = np.searchsorted(t, q_t[q], side="left") - 1
            ok = pos >= 0
        else:
            pos = np.searchsorted(t, q_t[q], side="right")
            ok = pos < len(t)
        out[q[ok]] = ops[pos[ok]]
    return out


# ---------------------------------------------------------------- cuda_sync records
@dataclass(frozen=True)
class _Record:
    kind: str  # "Stream Sync", "Context Sync", "Event Sync", "Stream Wait Event"
    device: Any
    stream: int  # the waiting stream (Stream Wait Event) or the synced one (Stream Sync)
    wait_on_stream: int  # where the awaited event was recorded
    wait_on_record: int  # correlation id of that cudaEventRecord


def _sync_records(cols: Columns, syncs: list[ks.Event]) -> dict[int, _Record]:
    """``cuda_sync`` records by the correlation id of the host call they describe."""
    out = {}
    for e in syncs:
        a = e.args
        if a is None or a.correlation < 0:
            continue
        dev = a.device if isinstance(a.device, int) and a.device >= 0 else e.pid
        stream = a.stream if isinstance(a.stream, int) else -1
        out[a.correlation] = _Record(e.name, dev, stream, a.wait_on_stream, a.wait_on_record)
    return out


def _host_rows_by_corr(cols: Columns) -> dict[int, int]:
    rows = np.flatnonzero(~cols.is_gpu & (cols.corr >= 0))
    return dict(zip(cols.corr[rows].tolist(), rows.tolist()))


def stream_number(tid: Any) -> Any:
    """A GPU lane's stream: early Kineto names it "stream 7", today's traces use the number."""
    s = tid[len("stream "):] if isinstance(tid, str) and tid.startswith("stream ") else tid
    return int(s) if isinstance(s, str) and s.isdigit() else s


def _gpu_lane(cols: Columns) -> dict[tuple[Any, Any], int]:
    """(device, stream) -> GPU lane."""
    return {(pid, stream_number(tid)): i for i, (g, pid, tid) in enumerate(cols.lane_keys) if g}


# ---------------------------------------------------------------- blocking copies
_COPY_NAME = re.compile(r"^Memcpy (\w+)(?: \((\w+) -> (\w+)\))?")


@lru_cache(maxsize=None)
def copy_rule(call: str, copy: str) -> Dep | None:
    """How a memcpy call waits for its copy, by the CUDA runtime's rules (None: it does not wait).

    To the host, a synchronous ``cudaMemcpy`` and any copy into pageable memory return once the copy
    has ended (COPY). From pageable host memory a synchronous call drains the stream, then stages the
    data and may return before the DMA ends (STAGE; an asynchronous one may, see ``_blocking_copies``).
    A synchronous copy from pinned memory is synchronous (COPY).
    """
    m = _COPY_NAME.match(copy)
    if not m or "emcpy" not in call:
        return None
    direction, src_mem, dst_mem = m.group(1), m.group(2) or "", m.group(3) or ""
    sync_call = not call.endswith("Async")
    if direction == "DtoH" and (sync_call or dst_mem == "Pageable"):
        return Dep.COPY
    if direction == "HtoD" and src_mem == "Pageable":
        return Dep.STAGE
    if direction == "HtoD" and sync_call:
        return Dep.COPY
    return None


def _blocking_copies(cols: Columns, kinds: Kinds) -> list[tuple[Dep, np.ndarray, np.ndarray]]:
    """COPY: copy -> its call (a wait on the copy's end); STAGE: the op before the copy on its stream -> the call.

    An asynchronous copy from pageable memory stages the data through a bounded pinned buffer: it
    blocks on the stream only when the data outgrows the buffer and the DMA (which runs in stream
    order) has to drain it. The trace tells which: a call that returned before its copy began was
    only staging (host work, no wait); one that returned after had waited for the copy to start.
    """
    g = np.flatnonzero((cols.own_kind == Kind.MEMCPY) & (kinds.launcher >= 0))
    r = kinds.launcher[g]
    per = len(cols.info)
    combos, inv = np.unique(cols.pair[r].astype(np.int64) * per + cols.pair[g], return_inverse=True)  # a few distinct (call, copy)
    call_name = [cols.names[cols.pair_name[k // per]] for k in combos.tolist()]
    rule = np.array([copy_rule(c, cols.names[cols.pair_name[k % per]]) or -1 for c, k in zip(call_name, combos.tolist())], dtype=np.int64)[inv]
    asynchronous = np.array([c.endswith("Async") for c in call_name], dtype=bool)[inv]
    copy = rule == Dep.COPY
    prev = np.maximum(g - 1, 0)  # rows are in (lane, start) order: the op before the copy on its stream
    stage = (rule == Dep.STAGE) & (g > 0) & (cols.lane[prev] == cols.lane[g]) & (~asynchronous | (cols.end[r] > cols.start[g]))
    return [(Dep.COPY, g[copy], r[copy]), (Dep.STAGE, prev[stage], r[stage])]


# ---------------------------------------------------------------- host syncs
_DEVICE_SYNC = re.compile(r"(Device|Ctx)Synchronize$")
_EVENT_SYNC = re.compile(r"EventSynchronize$")


def _host_syncs(cols: Columns, kinds: Kinds, issued: Issued, records: dict[int, _Record]) -> tuple[np.ndarray, np.ndarray]:
    """SYNC: the last op issued before a blocking sync call, on what it synchronises -> the call.

    A ``cuda_sync`` record names the stream (Stream Sync), the device (Context Sync) or the stream the
    event was recorded on and the record call (Event Sync). Without one: a stream sync waits on the
    stream its thread last issued to, a device sync on every stream, an event sync on the last op its
    thread issued before its latest ``cudaEventRecord`` (the awaited event was recorded no later).
    """
    own = cols.own_kind
    is_copy_call = np.zeros(cols.n, dtype=bool)
    is_copy_call[kinds.launcher[kinds.launcher >= 0]] = True
    calls = np.flatnonzero((own == Kind.COMM_WAIT) & ~cols.is_gpu & cols.has_role("") & ~is_copy_call)
    if not len(calls) or not len(issued.op):
        return _EMPTY, _EMPTY
    by_corr = _host_rows_by_corr(cols) if records else {}
    lane_of = _gpu_lane(cols)
    streams = distinct(issued.stream)
    # the stream each call's thread last issued to (its current stream)
    last_own = issued.last_before(issued.thread, cols.lane[calls], cols.start[calls])
    last_recorded = issued.last_before(issued.thread, cols.lane[calls], _last_record(cols, calls))
    src, dst = [], []
    q_stream, q_t, q_call = [], [], []
    for c, mine, recorded in zip(calls.tolist(), last_own.tolist(), last_recorded.tolist()):
        rec = records.get(int(cols.corr[c]))
        name = cols.name(c)
        if rec is not None and rec.kind == "Event Sync":
            r = by_corr.get(rec.wait_on_record, -1)
            lane = lane_of.get((rec.device, rec.wait_on_stream), -1)
            if r >= 0 and lane >= 0:
                q_stream.append(lane), q_t.append(cols.start[r]), q_call.append(c)
        elif rec is not None and rec.kind == "Stream Sync":
            lane = lane_of.get((rec.device, rec.stream), -1)
            if lane >= 0:
                q_stream.append(lane), q_t.append(cols.start[c]), q_call.append(c)
        elif (rec is not None and rec.kind == "Context Sync") or _DEVICE_SYNC.search(name):
            for lane in streams.tolist():
                q_stream.append(lane), q_t.append(cols.start[c]), q_call.append(c)
        elif _EVENT_SYNC.search(name):
            if recorded >= 0:
                src.append(recorded), dst.append(c)
        elif mine >= 0:  # a stream sync: the thread's current stream
            q_stream.append(int(cols.lane[mine])), q_t.append(cols.start[c]), q_call.append(c)
    if q_call:
        found = issued.last_before(issued.stream, np.array(q_stream), np.array(q_t))
        ok = found >= 0
        src += found[ok].tolist()
        dst += np.array(q_call)[ok].tolist()
    return np.array(src, np.int64), np.array(dst, np.int64)


def _last_record(cols: Columns, calls: np.ndarray) -> np.ndarray:
    """Per call, the start of the latest ``*EventRecord`` its thread made before it (-inf: none)."""
    is_record = np.array([cols.names[k].endswith("EventRecord") for k in cols.pair_name.tolist()], dtype=bool)[cols.pair]
    rec = np.flatnonzero(is_record & ~cols.is_gpu)  # rows are in (lane, start) order: the one before a call on its lane
    out = np.full(len(calls), -np.inf)
    k = np.searchsorted(rec, calls) - 1
    ok = k >= 0
    ok[ok] &= cols.lane[rec[k[ok]]] == cols.lane[calls[ok]]
    out[ok] = cols.start[rec[k[ok]]]
    return out


# ---------------------------------------------------------------- cross-stream waits
def _recorded_stream_waits(cols: Columns, issued: Issued, records: dict[int, _Record]) -> tuple[np.ndarray, np.ndarray]:
    """STREAM_WAIT: a ``cuda_sync`` "Stream Wait Event" record names the event's record call and stream:
    the last op issued there before the record -> the first op the waiting call's thread issued to the
    waiting stream after the call (HTA's rule)."""
    waits = [(c, rec) for c, rec in records.items() if rec.kind == "Stream Wait Event"]
    if not waits or not len(issued.op):
        return _EMPTY, _EMPTY
    by_corr = _host_rows_by_corr(cols)
    lane_of = _gpu_lane(cols)
    src_q, dst_q = [], []
    for corr, rec in waits:
        host, r = by_corr.get(corr, -1), by_corr.get(rec.wait_on_record, -1)
        a, b = lane_of.get((rec.device, rec.wait_on_stream), -1), lane_of.get((rec.device, rec.stream), -1)
        if host >= 0 and r >= 0 and a >= 0 and b >= 0:
            src_q.append((a, cols.start[r]))
            dst_q.append((b, int(cols.lane[host]), cols.start[host]))
    if not src_q:
        return _EMPTY, _EMPTY
    s_lane, s_t = map(np.array, zip(*src_q))
    d_lane, d_thread, d_t = map(np.array, zip(*dst_q))
    src = issued.last_before(issued.stream, s_lane, s_t)
    key = issued.stream * (int(issued.thread.max()) + 2) + issued.thread + 1
    dst = issued.first_after(key, d_lane * (int(issued.thread.max()) + 2) + d_thread + 1, d_t)
    miss = dst < 0
    dst[miss] = issued.first_after(issued.stream, d_lane[miss], d_t[miss])  # issued by another thread
    return src, dst


def _first_collective_launch(cols: Columns, nest: Nesting, issued: Issued) -> dict[int, float]:
    """Host collective call -> when it launched its first collective kernel."""
    out: dict[int, float] = {}
    r = issued.launch[issued.comm & (issued.launch >= 0)]
    for e, t in zip(nest.enqueue[r].tolist(), cols.start[r].tolist()):
        if e >= 0 and t < out.get(e, np.inf):
            out[e] = t
    return out


def _collective_ready(cols: Columns, nest: Nesting, issued: Issued) -> tuple[np.ndarray, np.ndarray]:
    """COLL_READY: a collective kernel waits for the work its thread issued before the collective call.

    ProcessGroupNCCL records an event on the caller's current stream when the call begins and makes
    the NCCL stream wait for it, so the collective follows the last compute op the same thread issued
    before its c10d call (before its launch when there is no c10d call around it).
    """
    coll = np.flatnonzero(issued.comm & (issued.thread >= 0))
    if not len(coll):
        return _EMPTY, _EMPTY
    r = issued.launch[coll]
    e = nest.enqueue[r]
    begin = cols.start[np.where(e >= 0, e, r)]
    src = issued.last_before(issued.thread, issued.thread[coll], begin, among=~issued.comm)
    return src, issued.op[coll]


def _plain_stream_waits(cols: Columns, nest: Nesting, issued: Issued, records: dict[int, _Record]) -> tuple[np.ndarray, np.ndarray, int]:
    """STREAM_WAIT_PLAIN: a ``cudaStreamWaitEvent`` that no record describes, outside the part of a
    collective call that joins the NCCL stream to the caller's (COLL_READY covers that).

    The event is not named, so the rule takes the latest collective issued before the call, whose
    completion event c10d's ``Work.wait()`` makes the caller's stream wait on, and the first op the
    calling thread issues after the call. When the measured timeline contradicts that pair (the op
    started before the collective ended), the edge is declined, not re-targeted: returned as a count.
    """
    is_wait = np.array([cols.names[k].endswith("StreamWaitEvent") for k in cols.pair_name.tolist()], dtype=bool)[cols.pair]
    waits = [w for w in np.flatnonzero(is_wait & ~cols.is_gpu).tolist()
             if getattr(records.get(int(cols.corr[w])), "kind", "") != "Stream Wait Event"]
    if not waits or not issued.comm.any():
        return _EMPTY, _EMPTY, 0
    first_launch = _first_collective_launch(cols, nest, issued)
    keep = []
    for w, e in zip(waits, nest.enqueue[waits].tolist()):
        if e >= 0 and cols.start[w] < first_launch.get(e, np.inf):
            continue  # the NCCL stream joining the caller's: COLL_READY
        keep.append(w)
    if not keep:
        return _EMPTY, _EMPTY, 0
    w = np.array(keep, dtype=np.int64)
    t = cols.start[w]
    src = issued.last_before(np.zeros(len(issued.op), np.int64), np.zeros(len(w), np.int64), t, among=issued.comm)
    dst = issued.first_after(issued.thread, cols.lane[w], t, among=~issued.comm)
    ok = (src >= 0) & (dst >= 0)
    ok[ok] &= cols.lane[src[ok]] != cols.lane[dst[ok]]
    src, dst = src[ok], dst[ok]
    contradicted = cols.start[dst] < cols.end[src] - CLOCK_JITTER_US
    return src[~contradicted], dst[~contradicted], len(set(zip(src[contradicted].tolist(), dst[contradicted].tolist())))


# ---------------------------------------------------------------- gloo host collectives
def _gloo_enqueues(cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """ENQUEUE: host enqueue -> CPU transfer (gloo): nothing links them in the trace, so pair by order and size per
    collective. Gloo runs collectives on a pool of threads, so two issued back to back may start in either
    order: a transfer takes the earliest unused enqueue of its own size (else the earliest unused one)."""
    cpu = ~cols.is_gpu
    transfers = np.flatnonzero(cpu & cols.has_role(ks.Role.TRANSFER))
    enq_all = np.flatnonzero(cpu & cols.has_role(ks.Role.ENQUEUE))
    if not len(transfers) or not len(enq_all):
        return _EMPTY, _EMPTY
    coll = cols.per_event("coll", object).copy()
    if "reducescatter" not in set(coll[transfers].tolist()):  # gloo reduce-scatters a tensor by all-reducing it (see _host_coll)
        coll[enq_all[coll[enq_all] == "reducescatter"]] = "allreduce"
    out_e, out_t = [], []
    for c in set(coll[transfers].tolist()):
        tr = transfers[coll[transfers] == c]
        tr = tr[np.argsort(cols.start[tr], kind="stable")]
        en = enq_all[coll[enq_all] == c]
        en = en[np.argsort(cols.start[en], kind="stable")]
        size = [ks.input_elems(cols.event(e)) for e in en.tolist()]
        free = list(range(len(en)))  # unused enqueues, in issue order
        for t in tr.tolist():
            ready = [k for k in free[:8] if cols.start[en[k]] <= cols.start[t]]  # the pool is a few threads deep
            if ready:
                own = ks.input_elems(cols.event(t))
                k = next((k for k in ready if size[k] == own), ready[0])
                free.remove(k)
                out_e.append(en[k])
                out_t.append(t)
    return np.array(out_e, dtype=np.int64), np.array(out_t, dtype=np.int64)


def _host_comm_waits(cols: Columns, kind: np.ndarray, ctx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """COMM_WAIT: a host wait (c10d wait, copy_bucket_to_grad) on a host transfer (gloo) follows the latest
    transfer that ended before the wait ended. With NCCL the host does not block there: such a wait
    is an ordinary op, and its kind (updated in ``kind``) falls back to its context's."""
    waits = np.flatnonzero((cols.own_kind == Kind.COMM_WAIT) & cols.has_role(ks.Role.WAIT))
    transfers = np.flatnonzero((kind == Kind.COMM) & ~cols.is_gpu)
    src, dst = _EMPTY, _EMPTY
    if len(transfers) and len(waits):
        end = cols.end
        o = transfers[np.argsort(end[transfers], kind="stable")]
        k = np.searchsorted(end[o], end[waits], side="right") - 1
        src, dst = o[k[k >= 0]], waits[k >= 0]
    unblocked = waits[~np.isin(waits, dst)]
    kind[unblocked] = np.where(np.isin(ctx[unblocked], CONTEXT_KINDS), ctx[unblocked], Kind.OTHER)
    return src, dst


# ---------------------------------------------------------------- the autograd thread
def main_lane(cols: Columns, kind: np.ndarray) -> int:
    """The thread that runs the training loop: the CPU lane with the step markers, else the process's
    main thread (on Linux its thread id is the process id), else the busiest one; -1 with no CPU lane."""
    nl = len(cols.lane_keys)
    lane_gpu = np.array([k[0] for k in cols.lane_keys], dtype=bool)
    if lane_gpu.all():
        return -1
    counts = np.bincount(cols.lane, minlength=nl)
    steps = np.bincount(cols.lane[kind == Kind.STEP], minlength=nl)
    is_main = np.array([str(pid) == str(tid) for _, pid, tid in cols.lane_keys], dtype=np.int64)
    return int(np.argmax(np.where(~lane_gpu, (steps * 2 + is_main) * 10**12 + counts, -1)))


def _backward_thread(cols: Columns, nest: Nesting, kind: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], int]:
    """BACKWARD_START / BACKWARD_END: the autograd engine runs backward on its own thread while the thread
    that called ``backward()`` blocks. Each burst of the autograd thread's ops (no op of the main thread
    starts inside it) follows the main thread's last op before it, and the main thread's next op follows
    the burst's last op. When the main thread's next op started before the burst ended, the main thread
    did not block and the second edge is declined (counted)."""
    main = main_lane(cols, kind)
    none = (_EMPTY, _EMPTY)
    if main < 0:
        return none, none, 0
    top = (nest.depth == 0) & ~cols.is_gpu
    bwd_lanes = [lane for lane in distinct(cols.lane[top & (kind == Kind.BACKWARD)]).tolist() if lane != main]  # it runs autograd nodes
    if not bwd_lanes:
        return none, none, 0
    on_main = np.flatnonzero((cols.lane == main) & (nest.depth >= 0))  # rows are sorted by start within a lane
    m_start = cols.start[on_main]
    by_end = on_main[np.argsort(cols.end[on_main], kind="stable")]
    m_end = cols.end[by_end]
    starts, ends, declined = ([], []), ([], []), 0
    for lane in bwd_lanes:
        b = np.flatnonzero(top & (cols.lane == lane))
        before = np.searchsorted(m_start, cols.start[b], side="left")  # main ops started before each
        first = np.flatnonzero(np.r_[True, before[1:] != before[:-1]])
        last = np.r_[first[1:] - 1, len(b) - 1]
        f, l_ = b[first], b[last]
        u = np.searchsorted(m_end, cols.start[f], side="right") - 1
        ok = u >= 0
        starts[0].append(by_end[u[ok]])
        starts[1].append(f[ok])
        v = np.searchsorted(m_start, cols.end[l_], side="left")
        ok = v < len(on_main)
        blocked = ok & (v == before[last])
        declined += int(np.sum(ok & ~blocked))
        ends[0].append(l_[blocked])
        ends[1].append(on_main[v[blocked]])
    cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else _EMPTY  # noqa: E731
    return (cat(starts[0]), cat(starts[1])), (cat(ends[0]), cat(ends[1])), declined
