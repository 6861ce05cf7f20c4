"""Stock torch.profiler (Kineto) traces -> ``RankTrace``: GPU and CPU, every schema generation.

Why it is shaped like this: a rank file has 10^5..10^6 events, so the reader
decodes typed structs (``kineto_schema``), turns them into numpy columns once,
and does per-name work (classification by regex) only once per distinct name.
The one sequential pass is the nesting walk per CPU thread (parents, depth,
inherited context), which is what lets kernels inherit FORWARD/BACKWARD from
the op that launched them and lets wrappers stay transparent.

Conventions on top of ``events.py``:
- wrappers (``user_annotation`` ranges such as ``ProfilerStep#N``,
  ``DistributedDataParallel.forward``, ``Optimizer.step#...``, module ranges)
  get ``depth == -1``: they are not nodes; their children count from depth 0;
- flows join depth-0 events only (a launch inside ``aten::mm`` is attributed to
  ``aten::mm``), so the graph builder can use them as node edges directly;
- ``seq`` is the per-group position on this rank (``Seq`` when the trace has it),
  carried by both the transfer (kernel / gloo op) and its host enqueue;
- ``meta["collectives"]`` holds, per transfer event, the canonical collective
  name and dtype (for cross-rank checks in ``dagprof.align``).
"""
from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from ..errors import DagprofError
from .events import EventTable, Kind, Lane, LaneKind, RankTrace
from . import kineto_schema as ks

_FILE_RANK = re.compile(r"rank[-_]?(\d+)", re.I)
_CTX_KINDS = np.array([Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE, Kind.DATA], dtype=np.int8)


def read_kineto(path: str | os.PathLike[str], rank: int | None = None) -> RankTrace:
    """Parse one rank's Kineto trace (.json or .json.gz). ``rank`` overrides what the file says."""
    path = os.fspath(path)
    trace = _decode(_read_bytes(path), path)
    if trace.traceEvents is None:
        raise DagprofError("not a Kineto trace: no 'traceEvents' list", path)
    return _Builder(trace, path, rank).build()


# ------------------------------------------------------------------ decoding
def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DagprofError(f"cannot read trace: {e.strerror or e}", path) from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise DagprofError(f"corrupt or truncated gzip ({e})", path) from None
    return data


def _decode(data: bytes, path: str) -> ks.Trace:
    try:
        return ks.TRACE_DECODER.decode(data)
    except msgspec.ValidationError:
        pass  # an unexpected field type somewhere: take the lenient path below
    except msgspec.DecodeError as e:
        raise DagprofError(f"not valid JSON, truncated or foreign file ({e})", path) from None
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise DagprofError(f"not valid JSON, truncated or foreign file ({e})", path) from None
    if not isinstance(doc, dict):
        raise DagprofError("not a Kineto trace: top level is not an object", path)
    return _lenient(doc, path)


def _lenient(doc: dict[str, Any], path: str) -> ks.Trace:
    """Field by field conversion, dropping only the values whose type is foreign."""
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise DagprofError("not a Kineto trace: no 'traceEvents' list", path)
    out = []
    arg_fields = {f: ks.Args.__struct_encode_fields__[i] for i, f in enumerate(ks.Args.__struct_fields__)}
    for e in events:
        if not isinstance(e, dict):
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        clean = {}
        for field, key in arg_fields.items():
            if key in args:
                try:
                    msgspec.convert({key: args[key]}, ks.Args, strict=False)
                    clean[key] = args[key]
                except msgspec.ValidationError:
                    pass
        base = {k: e[k] for k in ("ph", "name", "cat", "pid", "tid", "ts", "dur") if k in e}
        try:
            ev = msgspec.convert(base, ks.Event, strict=False)
        except msgspec.ValidationError:
            continue
        ev.args = msgspec.json.decode(msgspec.json.encode(clean), type=ks.Args)
        out.append(ev)
    raw = {k: msgspec.Raw(msgspec.json.encode(doc[k])) for k in ("distributedInfo", "schemaVersion") if k in doc}
    base_ns = doc.get("baseTimeNanoseconds")
    return ks.Trace(traceEvents=out, baseTimeNanoseconds=base_ns if isinstance(base_ns, int) else None,
                    host_name=str(doc.get("host_name", "")), **raw)


def _raw(value: msgspec.Raw) -> Any:
    """A lazily decoded field; None when the trace did not have it."""
    return msgspec.json.decode(value) if len(value) else None


# ------------------------------------------------------------------ per-name classification
@dataclass
class _NameInfo:
    kind: int  # own kind, Kind.OTHER when it takes its context's
    wrapper: bool
    ctx: int  # context it sets for its children, -1 none
    role: str  # kineto_schema.Role or ""
    coll: str
    step: int


def _classify(cat: str, name: str) -> _NameInfo:
    comm = ks.comm_role(cat, name)
    role, coll = comm if comm else ("", "")
    if cat in ks.GPU_CATS:
        kind = Kind.COMM if role == ks.Role.TRANSFER else Kind.MEMCPY if cat != "kernel" else Kind.KERNEL
        return _NameInfo(int(kind), False, -1, role, coll, -1)
    if cat in ks.RUNTIME_CATS:
        kind = Kind.COMM_WAIT if ks.SYNC_RUNTIME.match(name) else Kind.RUNTIME
        return _NameInfo(int(kind), False, -1, "", "", -1)
    if role == ks.Role.TRANSFER:
        return _NameInfo(int(Kind.COMM), False, -1, role, coll, -1)
    if role == ks.Role.WAIT:
        return _NameInfo(int(Kind.COMM_WAIT), False, -1, role, coll, -1)
    if role in (ks.Role.ENQUEUE, ks.Role.META):
        return _NameInfo(int(Kind.COMM_ENQUEUE), False, -1, role, coll, -1)
    m = ks.STEP_NAME.match(name)
    if m:
        return _NameInfo(int(Kind.STEP), True, -1, "", "", int(m.group(1)))
    if cat == "user_annotation":
        ctx = -1
        for pattern, k in ks.WRAPPER_CONTEXT:
            if pattern.search(name):
                ctx = k
                break
        return _NameInfo(int(Kind.OTHER), True, ctx, "", "", -1)
    if ks.BACKWARD_OP.search(name):
        return _NameInfo(int(Kind.BACKWARD), False, int(Kind.BACKWARD), "", "", -1)
    if "DataLoader" in name:
        return _NameInfo(int(Kind.DATA), False, int(Kind.DATA), "", "", -1)
    return _NameInfo(int(Kind.OTHER), False, -1, "", "", -1)


# ------------------------------------------------------------------ the builder
class _Builder:
    def __init__(self, trace: ks.Trace, path: str, rank: int | None):
        self.trace, self.path, self.rank_arg = trace, path, rank

    def build(self) -> RankTrace:
        evs = self.trace.traceEvents or []
        self._metadata(evs)
        xs = [e for e in evs if e.ph == "X" and e.cat not in ks.SKIP_CATS and type(e.pid) is int]
        syncs = [e for e in evs if e.ph == "X" and e.cat == "cuda_sync"]
        self._columns(xs)
        self._nest()
        self._kinds_and_steps()
        flows = self._flows(syncs)
        self._collectives()
        return self._rank_trace(flows)

    # -- metadata events and distributedInfo
    def _metadata(self, evs: list[ks.Event]) -> None:
        self.thread_names: dict[tuple[Any, Any], str] = {}
        for e in evs:
            if e.ph == "M" and e.name == "thread_name" and e.args is not None and len(e.args.name):
                self.thread_names[(e.pid, e.tid)] = str(_raw(e.args.name))
        info = _raw(self.trace.distributedInfo)
        self.dist = info if isinstance(info, dict) else {}

    # -- flat columns in (lane, start, longest-first) order
    def _columns(self, xs: list[ks.Event]) -> None:
        n = len(xs)
        pairs: dict[tuple[str, str], int] = {}
        lanes: dict[tuple[bool, Any, Any], int] = {}
        gpu = ks.GPU_CATS
        pair = np.fromiter((pairs.setdefault((e.cat, e.name), len(pairs)) for e in xs), np.int32, n)
        lane = np.fromiter((lanes.setdefault((e.cat in gpu, e.pid, e.tid), len(lanes)) for e in xs), np.int32, n)
        ts = np.fromiter((e.ts for e in xs), np.float64, n)
        dur = np.fromiter((e.dur for e in xs), np.float64, n)
        np.maximum(dur, 0.0, out=dur)
        order = np.lexsort((-dur, ts, lane))
        self.xs = [xs[i] for i in order.tolist()]
        self.pair, self.lane, ts, self.dur = pair[order], lane[order], ts[order], dur[order]
        self.t0 = float(ts.min()) if n else 0.0
        self.start = ts - self.t0
        self.n = n
        self.lane_keys = list(lanes)
        self.lane_gpu = np.array([k[0] for k in self.lane_keys], dtype=bool)
        self.is_gpu = self.lane_gpu[self.lane] if n else np.zeros(0, bool)
        names: dict[str, int] = {}
        self.pair_name = np.array([names.setdefault(nm, len(names)) for _, nm in pairs], dtype=np.int32)
        self.names = list(names)
        self.info = [_classify(cat, nm) for cat, nm in pairs]
        self.pair_kind = np.array([i.kind for i in self.info], dtype=np.int8)
        self.pair_ctx = np.array([i.ctx for i in self.info], dtype=np.int8)
        self.pair_wrapper = np.array([i.wrapper for i in self.info], dtype=bool)

    # -- nesting walk: parent, depth (wrappers transparent), top-level ancestor, context
    def _nest(self) -> None:
        n = self.n
        depth = [0] * n
        top = list(range(n))
        ctx = [-1] * n
        parent = [-1] * n
        cpu_idx = np.flatnonzero(~self.is_gpu).tolist()
        st = self.start.tolist()
        en = (self.start + self.dur).tolist()
        wrap = self.pair_wrapper[self.pair].tolist()
        own_ctx = self.pair_ctx[self.pair].tolist()
        lane = self.lane.tolist()
        nd = [0] * n  # non-wrapper events on the chain, including the event itself
        eff_end = en[:]
        stack: list[int] = []
        cur = -1
        for i in cpu_idx:
            if lane[i] != cur:
                stack.clear()
                cur = lane[i]
            s = st[i]
            while stack and eff_end[stack[-1]] <= s:
                stack.pop()
            w = wrap[i]
            if stack:
                p = stack[-1]
                parent[i] = p
                if eff_end[i] > eff_end[p]:
                    eff_end[i] = eff_end[p]
                c = own_ctx[i]
                ctx[i] = c if c >= 0 else ctx[p]
                k = nd[p]
                if w:
                    nd[i] = k
                    depth[i] = -1
                    top[i] = top[p] if k else -1
                else:
                    nd[i] = k + 1
                    depth[i] = k
                    if k:
                        top[i] = top[p]
            else:
                ctx[i] = own_ctx[i]
                if w:
                    depth[i] = -1
                    top[i] = -1
                else:
                    nd[i] = 1
            stack.append(i)
        self.depth = np.array(depth, dtype=np.int16)
        self.top = np.array(top, dtype=np.int64)
        self.ctx = np.array(ctx, dtype=np.int8)
        self.parent = np.array(parent, dtype=np.int64)

    # -- kinds (with forward inferred from step phase) and step numbers
    def _kinds_and_steps(self) -> None:
        kind = self.pair_kind[self.pair].copy()
        start, end = self.start, self.start + self.dur
        is_step = kind == Kind.STEP
        step_no = np.array([i.step for i in self.info], dtype=np.int32)[self.pair]
        # step windows, from the STEP markers (one lane has them)
        s_idx = np.flatnonzero(is_step)
        s_idx = s_idx[np.argsort(start[s_idx], kind="stable")]
        s_start, s_end, s_num = start[s_idx], end[s_idx], step_no[s_idx]
        step = np.full(self.n, -1, dtype=np.int32)
        if len(s_idx):
            k = np.searchsorted(s_start, start, side="right") - 1
            inside = (k >= 0) & (start < s_end[np.maximum(k, 0)])
            step[inside] = s_num[k[inside]]
        step[is_step] = s_num[np.searchsorted(s_start, start[is_step])] if len(s_idx) else -1
        # forward: CPU work with no explicit context between a step's start and its first backward op
        ctx = self.ctx.copy()
        cpu = ~self.is_gpu
        if len(s_idx):
            slot = np.searchsorted(s_start, start, side="right") - 1
            in_step = cpu & (slot >= 0) & (step >= 0)
            bwd = in_step & ((ctx == Kind.BACKWARD) | (kind == Kind.BACKWARD))
            first_bwd = s_end.copy()
            np.minimum.at(first_bwd, slot[bwd], start[bwd])
            fwd = in_step & (ctx < 0) & (start < first_bwd[np.maximum(slot, 0)])
            ctx[fwd] = Kind.FORWARD
        ctx_kind = np.isin(ctx, _CTX_KINDS)
        take = cpu & (kind == Kind.OTHER) & ctx_kind
        kind[take] = ctx[take]
        # GPU work: launched by the runtime call with the same correlation id
        corr = np.fromiter((e.args.correlation if e.args is not None else -1 for e in self.xs), np.int64, self.n)
        is_rt = np.isin(self.pair_kind[self.pair], (Kind.RUNTIME, Kind.COMM_WAIT)) & cpu & (corr >= 0)
        launcher = np.full(self.n, -1, dtype=np.int64)
        rt = np.flatnonzero(is_rt)
        gpu = np.flatnonzero(self.is_gpu & (corr >= 0))
        if len(rt) and len(gpu):
            o = np.argsort(corr[rt], kind="stable")
            rc = corr[rt][o]
            pos = np.searchsorted(rc, corr[gpu])
            pos_c = np.minimum(pos, len(rc) - 1)
            hit = rc[pos_c] == corr[gpu]
            launcher[gpu[hit]] = rt[o][pos_c[hit]]
        launched = np.flatnonzero(launcher >= 0)
        lk = ctx[launcher[launched]]
        inherit = (kind[launched] == Kind.KERNEL) & np.isin(lk, _CTX_KINDS[:3])
        kind[launched[inherit]] = lk[inherit]
        step[launched] = step[launcher[launched]]
        self.kind, self.step, self.corr, self.launcher, self.eff_ctx = kind, step, corr, launcher, ctx

    # -- intra-rank dependencies between depth-0 events
    def _flows(self, syncs: list[ks.Event]) -> np.ndarray:
        src: list[np.ndarray] = []
        dst: list[np.ndarray] = []
        launched = np.flatnonzero(self.launcher >= 0)
        src.append(self.top[self.launcher[launched]])
        dst.append(launched)
        self.enqueue_of = np.full(self.n, -1, dtype=np.int64)
        self.enqueue_of[launched] = self.top[self.launcher[launched]]
        e, t = self._gloo_enqueues()
        self.enqueue_of[t] = e
        src.append(self.top[e])
        dst.append(t)
        w_src, w_dst = self._waits()
        src.append(w_src)
        dst.append(w_dst)
        f = np.stack([np.concatenate(src), np.concatenate(dst)], axis=1).astype(np.int64)
        f = f[(f[:, 0] >= 0) & (f[:, 1] >= 0) & (f[:, 0] != f[:, 1])]
        f = f[(self.depth[f[:, 0]] == 0) & (self.depth[f[:, 1]] == 0)]
        return np.unique(f, axis=0) if len(f) else f.reshape(0, 2)

    def _roles(self) -> list[str]:
        return [self.info[p].role for p in self.pair.tolist()]

    def _gloo_enqueues(self) -> tuple[np.ndarray, np.ndarray]:
        """Host enqueue -> CPU transfer (gloo): nothing links them in the trace, so pair by order per collective."""
        pair_role = np.array([i.role for i in self.info], dtype=object)
        pair_coll = np.array([i.coll for i in self.info], dtype=object)
        role, coll = pair_role[self.pair], pair_coll[self.pair]
        cpu = ~self.is_gpu
        transfers = np.flatnonzero(cpu & (role == ks.Role.TRANSFER))
        enq_all = np.flatnonzero(cpu & (role == ks.Role.ENQUEUE))
        out_e, out_t = [], []
        for c in set(coll[transfers].tolist()):
            tr = transfers[coll[transfers] == c]
            tr = tr[np.argsort(self.start[tr], kind="stable")]
            en = enq_all[coll[enq_all] == c]
            en = en[np.argsort(self.start[en], kind="stable")]
            j = 0
            for t in tr.tolist():  # the earliest unused enqueue, if it started before the transfer
                if j < len(en) and self.start[en[j]] <= self.start[t]:
                    out_e.append(en[j])
                    out_t.append(t)
                    j += 1
        return np.array(out_e, dtype=np.int64), np.array(out_t, dtype=np.int64)

    def _waits(self) -> tuple[np.ndarray, np.ndarray]:
        """A wait depends on the latest transfer (c10d wait, copy_bucket_to_grad) or GPU op (cuda sync) done before it ends."""
        end = self.start + self.dur
        kind0 = self.pair_kind[self.pair]
        waits = np.flatnonzero(kind0 == Kind.COMM_WAIT)
        if not len(waits):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        device_sync = np.array([i.role == "" for i in self.info])[self.pair[waits]]
        src_out, dst_out = [], []
        for cand_mask, wmask in ((self.kind == Kind.COMM, ~device_sync), (self.is_gpu, device_sync)):
            cand = np.flatnonzero(cand_mask)
            w = waits[wmask]
            if not len(cand) or not len(w):
                continue
            o = cand[np.argsort(end[cand], kind="stable")]
            k = np.searchsorted(end[o], end[w], side="right") - 1
            ok = k >= 0
            src_out.append(o[k[ok]])
            dst_out.append(self.top[w[ok]])
        if not src_out:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(src_out), np.concatenate(dst_out)

    # -- collectives: group, seq, bytes
    def _collectives(self) -> None:
        n = self.n
        self.group_names: list[str] = []
        self.group_ranks: dict[str, list[int]] = {}
        for pg in self.dist.get("pg_config") or []:
            if isinstance(pg, dict) and "pg_name" in pg:
                self.group_ranks[str(pg["pg_name"])] = [int(r) for r in pg.get("ranks") or []]
        self.group = np.full(n, -1, dtype=np.int32)
        self.seq = np.full(n, -1, dtype=np.int64)
        self.nbytes = np.zeros(n, dtype=np.int64)
        for i in np.flatnonzero(self.pair_kind[self.pair] == Kind.MEMCPY).tolist():
            a = self.xs[i].args
            self.nbytes[i] = a.nbytes if a is not None and a.nbytes > 0 else 0
        transfers = np.flatnonzero(self.kind == Kind.COMM)
        # host-side argument records, keyed by the depth-0 op they sit in
        meta_of: dict[int, list[int]] = {}
        roles = np.array([i.role == ks.Role.META for i in self.info])[self.pair]
        for i in np.flatnonzero(roles).tolist():
            meta_of.setdefault(int(self.top[i]), []).append(i)
        coll_out, dtype_out, explicit_seq = [], [], []
        gids: dict[str, int] = {}
        for t in transfers.tolist():
            enq = int(self.enqueue_of[t])
            recs = [t] + meta_of.get(enq, [])
            info = _comm_args([self.xs[r] for r in recs])
            coll = self.info[self.pair[t]].coll or info.get("coll", "")
            if info.get("coll"):
                coll = info["coll"]
            g = info.get("group", "0")
            if g not in gids:
                gids[g] = len(gids)
            self.group[t] = gids[g]
            self.nbytes[t] = info.get("nbytes", 0)
            self.seq[t] = info.get("seq", -1)
            explicit_seq.append(self.seq[t] >= 0)
            if info.get("ranks") and g not in self.group_ranks:
                self.group_ranks[g] = info["ranks"]
            coll_out.append(coll)
            dtype_out.append(info.get("dtype", "") or ks.kernel_dtype(self.xs[t].name))
        self.group_names = list(gids)
        # counted order per group, by issue time (the enqueue) when known
        issue = np.where(self.enqueue_of[transfers] >= 0, self.start[np.maximum(self.enqueue_of[transfers], 0)], self.start[transfers])
        if len(transfers) and not all(explicit_seq):
            for g in range(len(gids)):
                sel = transfers[self.group[transfers] == g]
                o = np.argsort(issue[self.group[transfers] == g], kind="stable")
                self.seq[sel[o]] = np.arange(len(sel))
        enq = self.enqueue_of[transfers]
        has = enq >= 0
        self.group[enq[has]] = self.group[transfers[has]]
        self.seq[enq[has]] = self.seq[transfers[has]]
        self.nbytes[enq[has]] = self.nbytes[transfers[has]]
        self.coll_meta = {"event": transfers.tolist(), "coll": coll_out, "dtype": dtype_out}

    # -- rank identity and assembly
    def _identity(self) -> tuple[int, int, str]:
        if self.rank_arg is not None:
            rank, source = int(self.rank_arg), "argument"
        elif isinstance(self.dist.get("rank"), int):
            rank, source = int(self.dist["rank"]), "distributedInfo"
        else:
            m = _FILE_RANK.search(os.path.basename(self.path))
            if not m:
                what = "no distributedInfo" if not self.dist else "distributedInfo has no rank"
                raise DagprofError(f"{what} and the file name carries no rank (name it rank-N...json or pass rank=)", self.path)
            rank, source = int(m.group(1)), "file name"
        world = self.dist.get("world_size")
        if not isinstance(world, int):
            sizes = [int(pg.get("pg_size", 0)) for pg in self.dist.get("pg_config") or [] if isinstance(pg, dict)]
            world = max(sizes + [rank + 1])
        return rank, world, source

    def _rank_trace(self, flows: np.ndarray) -> RankTrace:
        rank, world, source = self._identity()
        lanes = self._lanes()
        table = EventTable.from_columns(
            self.names, name=self.pair_name[self.pair], kind=self.kind, lane=self.lane, start=self.start,
            dur=self.dur, depth=self.depth, step=self.step, nbytes=self.nbytes, group=self.group, seq=self.seq,
        )
        base = self.trace.baseTimeNanoseconds or 0
        meta = {"format": "kineto", "rank_source": source, "collectives": self.coll_meta,
                "schema": _raw(self.trace.schemaVersion)}
        return RankTrace(
            rank=rank, world_size=world, source=self.path, events=table, lanes=lanes,
            base_ns=int(base + round(self.t0 * 1000.0)), host=self.trace.host_name,
            backend=str(self.dist.get("backend", "")), groups=self.group_names, group_ranks=self.group_ranks,
            flows=flows, meta=meta,
        )

    def _lanes(self) -> list[Lane]:
        counts = np.bincount(self.lane, minlength=len(self.lane_keys))
        steps = np.bincount(self.lane[self.kind == Kind.STEP], minlength=len(self.lane_keys))
        comm_only = np.bincount(self.lane[(self.kind == Kind.COMM) | (self.depth < 0)], minlength=len(self.lane_keys)) == counts
        cpu = ~self.lane_gpu
        main = -1
        if cpu.any():
            score = np.where(cpu, steps * 10**12 + counts, -1)
            main = int(np.argmax(score))
        lanes = []
        for i, (is_gpu, pid, tid) in enumerate(self.lane_keys):
            if is_gpu:
                lanes.append(Lane(f"GPU {pid} stream {tid}", LaneKind.GPU_STREAM))
                continue
            name = self.thread_names.get((pid, tid), f"thread {tid}")
            kind = LaneKind.COMM_THREAD if ("gloo" in name or comm_only[i]) and i != main else LaneKind.CPU_THREAD
            lanes.append(Lane(name, kind, main=i == main))
        return lanes


def _dims_elems(dims: Any) -> int:
    """Elements of the first input (a tensor's dims, or a tensor list's)."""
    if not isinstance(dims, list) or not dims:
        return 0
    first = dims[0]
    if isinstance(first, list) and first and all(isinstance(x, list) for x in first):
        return sum(int(np.prod(d)) if d else 0 for d in first)
    if isinstance(first, list) and first and all(isinstance(x, int) for x in first):
        return int(np.prod(first))
    return 0


def _comm_args(records: list[ks.Event]) -> dict[str, Any]:
    """The richest description any of a collective's records gives (transfer first, then host records)."""
    out: dict[str, Any] = {}
    for e in records:
        a = e.args
        if a is None:
            continue
        if a.coll and "coll" not in out:
            out["coll"] = ks.canonical_collective(a.coll)
        if len(a.pg_name) and "group" not in out:
            out["group"] = str(_raw(a.pg_name))
        if a.seq >= 0 and "seq" not in out:
            out["seq"] = a.seq
        if len(a.pg_ranks) and "ranks" not in out:
            r = _raw(a.pg_ranks)
            try:
                out["ranks"] = [int(x) for x in (json.loads(r) if isinstance(r, str) else r)]
            except (ValueError, TypeError):
                pass
        if "nbytes" not in out:
            dtype = a.dtype
            nelems = a.in_nelems if a.in_nelems >= 0 else -1
            if nelems < 0 and len(a.input_dims):
                nelems = _dims_elems(_raw(a.input_dims))
                types = _raw(a.input_type)
                dtype = dtype or (types[0] if isinstance(types, list) and types and isinstance(types[0], str) else "")
            if nelems > 0 and ks.dtype_bytes(dtype):
                out["nbytes"] = nelems * ks.dtype_bytes(dtype)
                out["dtype"] = dtype
    return out
