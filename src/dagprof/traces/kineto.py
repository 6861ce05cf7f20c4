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
- flows join the exact events (a ``cudaLaunchKernel`` nested in ``aten::mm`` -> the
  kernel; a GPU op -> the ``cudaStreamSynchronize`` waiting for it); the graph
  builder splits depth-0 ops at nested endpoints;
- ``seq`` is the per-group position on this rank (``Seq`` when the trace has it),
  carried by both the transfer (kernel / gloo op) and its host enqueue;
- rank: ``distributedInfo.rank``, else the file name (``rank-3.json``,
  ``sampled_rank-1.json.gz``), else rank 0 when there is no ``distributedInfo`` at all
  (a single-process profile); ``meta["rank_source"]`` says which;
- ``meta["collectives"]`` holds, per transfer event, the canonical collective
  name and dtype (for cross-rank checks in ``dagprof.align``).
"""
from __future__ import annotations

import gc
import operator
import os
import re
from typing import Any

import numpy as np

from ..errors import DagprofError
from . import kineto_schema as ks
from .events import EventTable, Kind, Lane, LaneKind, RankTrace
from .kineto_decode import decode_trace, raw_value, read_bytes

_NAME, _CAT, _PID, _TID, _TS, _DUR = (operator.attrgetter(f) for f in ("name", "cat", "pid", "tid", "ts", "dur"))


def _CORR(e: ks.Event) -> int:
    return e.args.correlation if e.args is not None else -1


_FILE_RANK = re.compile(r"rank[-_]?(\d+)", re.I)
_CTX_KINDS = np.array([Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE, Kind.DATA], dtype=np.int8)


def read_kineto(path: str | os.PathLike[str], rank: int | None = None) -> RankTrace:
    """Parse one rank's Kineto trace (.json or .json.gz). ``rank`` overrides what the file says."""
    path = os.fspath(path)
    was_enabled = gc.isenabled()
    gc.disable()  # 10^5..10^6 acyclic objects: collection passes would cost a third of the parse
    try:
        trace = decode_trace(read_bytes(path), path)  # a checked Kineto trace, or a one-line DagprofError
        out = _Builder(trace, path, rank).build()
        if trace.notes:
            out.meta["warnings"] = [f"{os.path.basename(path)}: {n}" for n in trace.notes]
        return out
    finally:
        if was_enabled:
            gc.enable()


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
                self.thread_names[(e.pid, e.tid)] = str(raw_value(e.args.name))
        info = raw_value(self.trace.distributedInfo)
        self.dist = info if isinstance(info, dict) else {}

    # -- flat columns in (lane, start, longest-first) order
    def _columns(self, xs: list[ks.Event]) -> None:
        n = len(xs)
        name_id, names = _intern(list(map(_NAME, xs)))
        cat_id, cat_ids = _intern(list(map(_CAT, xs)))
        cats = list(cat_ids)
        pair_keys, pair = np.unique(name_id.astype(np.int64) * len(cats) + cat_id, return_inverse=True)
        cat_gpu = np.array([c in ks.GPU_CATS for c in cats], dtype=np.int64)
        pid, pids = _intern_ids(list(map(_PID, xs)))
        tid, tids = _intern_ids(list(map(_TID, xs)))  # usually ints, but the format allows strings
        lane_codes, lane = np.unique((cat_gpu[cat_id] * len(pids) + pid) * len(tids) + tid, return_inverse=True)
        ts = np.fromiter(map(_TS, xs), np.float64, n)
        dur = np.fromiter(map(_DUR, xs), np.float64, n)
        np.maximum(dur, 0.0, out=dur)
        order = np.lexsort((-dur, ts, lane))
        self.xs = xs  # file order; self.orig maps a row to it
        self.orig = order
        self.pair, self.lane, ts, self.dur = pair[order].astype(np.int32), lane[order].astype(np.int32), ts[order], dur[order]
        self.t0 = float(ts.min()) if n else 0.0
        self.start = ts - self.t0
        self.n = n
        pids_l, tids_l = list(pids), list(tids)
        self.lane_keys = [(bool(c // len(tids_l) // len(pids_l)), pids_l[c // len(tids_l) % len(pids_l)], tids_l[c % len(tids_l)])
                          for c in lane_codes.tolist()]
        self.lane_gpu = np.array([k[0] for k in self.lane_keys], dtype=bool)
        self.is_gpu = self.lane_gpu[self.lane] if n else np.zeros(0, bool)
        self.names = list(names)
        self.pair_name = (pair_keys // len(cats)).astype(np.int32)
        self.info = [ks.classify(cats[int(k) % len(cats)], self.names[int(k) // len(cats)]) for k in pair_keys.tolist()]
        self.pair_kind = np.array([i.kind for i in self.info], dtype=np.int8)
        self.pair_ctx = np.array([i.ctx for i in self.info], dtype=np.int8)
        self.pair_wrapper = np.array([i.wrapper for i in self.info], dtype=bool)

    def event(self, i: int) -> ks.Event:
        return self.xs[self.orig[i]]

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
        corr = np.fromiter(map(_CORR, self.xs), np.int64, self.n)[self.orig]
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

    # -- intra-rank dependencies; endpoints may be nested (the graph builder splits at them)
    def _flows(self, syncs: list[ks.Event]) -> np.ndarray:
        launched = np.flatnonzero(self.launcher >= 0)
        self.enqueue_of = np.full(self.n, -1, dtype=np.int64)
        comm = launched[self.kind[launched] == Kind.COMM]
        self.enqueue_of[comm] = [self._enclosing_enqueue(int(r)) for r in self.launcher[comm].tolist()]
        e, t = self._gloo_enqueues()
        self.enqueue_of[t] = e
        w_src, w_dst = self._waits()
        s_src, s_dst = self._cuda_syncs(syncs)
        f = np.stack([np.concatenate([self.launcher[launched], e, w_src, s_src]),
                      np.concatenate([launched, t, w_dst, s_dst])], axis=1).astype(np.int64)
        f = f[(f[:, 0] >= 0) & (f[:, 1] >= 0) & (f[:, 0] != f[:, 1])]
        key = np.unique(f[:, 0] * self.n + f[:, 1])  # dedup + sort on one int key (axis=0 unique is slow)
        return np.stack([key // self.n, key % self.n], axis=1) if len(key) else f.reshape(0, 2)

    def _enclosing_enqueue(self, i: int) -> int:
        """The host collective call (c10d::*) around event ``i``, else its depth-0 op."""
        j = i
        while j >= 0:
            if self.info[self.pair[j]].role == ks.Role.ENQUEUE:
                return j
            j = int(self.parent[j])
        return int(self.top[i])

    def _gloo_enqueues(self) -> tuple[np.ndarray, np.ndarray]:
        """Host enqueue -> CPU transfer (gloo): nothing links them in the trace, so pair by order and size per
        collective. Gloo runs collectives on a pool of threads, so two issued back to back may start in either
        order: a transfer takes the earliest unused enqueue of its own size (else the earliest unused one)."""
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
            size = [ks.input_elems(self.event(e)) for e in en.tolist()]
            free = list(range(len(en)))  # unused enqueues, in issue order
            for t in tr.tolist():
                ready = [k for k in free[:8] if self.start[en[k]] <= self.start[t]]  # the pool is a few threads deep
                if ready:
                    own = ks.input_elems(self.event(t))
                    k = next((k for k in ready if size[k] == own), ready[0])
                    free.remove(k)
                    out_e.append(en[k])
                    out_t.append(t)
        return np.array(out_e, dtype=np.int64), np.array(out_t, dtype=np.int64)

    def _waits(self) -> tuple[np.ndarray, np.ndarray]:
        """Dependencies nothing in the trace links explicitly, each from what the runtime guarantees.

        - a host wait (c10d wait, copy_bucket_to_grad) on a host transfer (gloo): after the latest
          transfer that ended before the wait ended; with NCCL the host does not block, so such
          waits are ordinary ops (their kind falls back to their context's);
        - a device sync (cudaStreamSynchronize, ...): after the latest GPU op that ended before it;
        - NCCL: the comm stream waits for the work enqueued on the compute stream before the
          collective was issued, and the compute stream's next work after a
          ``cudaStreamWaitEvent`` outside a c10d call waits for the latest issued collective.
        """
        end = self.start + self.dur
        out: list[tuple[np.ndarray, np.ndarray]] = []
        waits = np.flatnonzero(self.pair_kind[self.pair] == Kind.COMM_WAIT)
        device_sync = np.array([i.role == "" for i in self.info])[self.pair[waits]]
        host_transfer = np.flatnonzero((self.kind == Kind.COMM) & ~self.is_gpu)
        gpu = np.flatnonzero(self.is_gpu)
        blocked = np.empty(0, np.int64)
        for cand, w in ((host_transfer, waits[~device_sync]), (gpu, waits[device_sync])):
            if len(cand) and len(w):
                o = cand[np.argsort(end[cand], kind="stable")]
                k = np.searchsorted(end[o], end[w], side="right") - 1
                out.append((o[k[k >= 0]], w[k >= 0]))
                blocked = np.concatenate([blocked, w[k >= 0]])
        unblocked = waits[~device_sync & ~np.isin(waits, blocked)]  # e.g. copy_bucket_to_grad under NCCL
        ctx = self.eff_ctx[unblocked]
        self.kind[unblocked] = np.where(np.isin(ctx, _CTX_KINDS), ctx, Kind.OTHER)
        out.extend(self._stream_waits())
        if not out:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate([o[0] for o in out]), np.concatenate([o[1] for o in out])

    def _stream_waits(self) -> list[tuple[np.ndarray, np.ndarray]]:
        gpu = np.flatnonzero(self.is_gpu & (self.launcher >= 0))
        if not len(gpu):
            return []
        issued = self.start[self.launcher[gpu]]
        o = np.argsort(issued, kind="stable")
        gpu, issued = gpu[o], issued[o]
        comm = self.kind[gpu] == Kind.COMM
        work, work_t = gpu[~comm], issued[~comm]
        coll, coll_t = gpu[comm], issued[comm]
        out = []
        if len(coll) and len(work):
            k = np.searchsorted(work_t, coll_t, side="left") - 1
            out.append((work[k[k >= 0]], coll[k >= 0]))
        is_wait = np.array([nm.endswith("StreamWaitEvent") for nm in self._pair_names()])[self.pair]
        waits = np.flatnonzero(is_wait & ~self.is_gpu)
        waits = np.array([w for w in waits.tolist() if self.info[self.pair[self._enclosing_enqueue(w)]].role != ks.Role.ENQUEUE], dtype=np.int64)
        if len(coll) and len(work) and len(waits):
            t = self.start[waits]
            c = np.searchsorted(coll_t, t, side="left") - 1
            g = np.searchsorted(work_t, t, side="right")
            ok = (c >= 0) & (g < len(work))
            out.append((coll[c[ok]], work[g[ok]]))
        return out

    def _cuda_syncs(self, syncs: list[ks.Event]) -> tuple[np.ndarray, np.ndarray]:
        """Explicit CUDA sync records (``cuda_sync``, newer Kineto): the recorded stream's last op
        issued before ``cudaEventRecord`` -> the waiting host call (Event Sync) or the waiting
        stream's next op (Stream Wait Event)."""
        if not syncs:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        rt = np.flatnonzero(~self.is_gpu & (self.corr >= 0))
        by_corr = dict(zip(self.corr[rt].tolist(), rt.tolist()))
        gpu = np.flatnonzero(self.is_gpu & (self.launcher >= 0))
        issued = self.start[self.launcher[gpu]]
        per_stream: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        lane_of = {(pid, tid): i for i, (g, pid, tid) in enumerate(self.lane_keys) if g}
        for key, lane in lane_of.items():
            sel = self.lane[gpu] == lane
            o = np.argsort(issued[sel], kind="stable")
            per_stream[key] = (gpu[sel][o], issued[sel][o])
        src, dst = [], []
        for e in syncs:
            a = e.args
            host = by_corr.get(a.correlation, -1) if a is not None else -1
            record = by_corr.get(a.wait_on_record, -1) if a is not None and a.wait_on_record >= 0 else -1
            if host < 0 or record < 0:
                continue
            ops, t = per_stream.get((_as_int(a.device, e.pid), a.wait_on_stream), (None, None))
            if ops is None:
                continue
            k = np.searchsorted(t, self.start[record], side="left") - 1
            if k < 0:
                continue
            if e.name == "Stream Wait Event":
                nxt, tn = per_stream.get((_as_int(a.device, e.pid), _as_int(a.stream, -1)), (None, None))
                j = np.searchsorted(tn, self.start[host], side="right") if nxt is not None else -1
                if nxt is None or j >= len(nxt):
                    continue
                src.append(int(ops[k]))
                dst.append(int(nxt[j]))
            elif self.kind[host] == Kind.COMM_WAIT:  # a blocking call, not a poll (cudaEventQuery)
                src.append(int(ops[k]))
                dst.append(host)
        return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)

    def _pair_names(self) -> list[str]:
        return [self.names[i] for i in self.pair_name.tolist()]

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
            a = self.event(i).args
            self.nbytes[i] = a.nbytes if a is not None and a.nbytes > 0 else 0
        transfers = np.flatnonzero(self.kind == Kind.COMM)
        # host-side argument records, keyed by the depth-0 op they sit in
        meta_of: dict[int, list[int]] = {}
        roles = np.array([i.role == ks.Role.META for i in self.info])[self.pair]
        for i in np.flatnonzero(roles).tolist():
            meta_of.setdefault(self._enclosing_enqueue(i), []).append(i)
        coll_out, dtype_out, explicit_seq = [], [], []
        gids: dict[str, int] = {}
        for t in transfers.tolist():
            enq = int(self.enqueue_of[t])
            recs = [t] + meta_of.get(enq, [])
            info = ks.collective_args([self.event(r) for r in recs])
            # metadata, else the host call (c10d::alltoall_base_ launches a SendRecv kernel), else the kernel
            enq_coll = self.info[self.pair[enq]].coll if enq >= 0 else ""
            coll = info.get("coll") or enq_coll or self.info[self.pair[t]].coll
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
            dtype_out.append(info.get("dtype", "") or ks.kernel_dtype(self.event(t).name))
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
        self.explicit_seq = bool(explicit_seq) and all(explicit_seq)

    # -- rank identity and assembly
    def _identity(self) -> tuple[int, int, str]:
        if self.rank_arg is not None:
            rank, source = int(self.rank_arg), "argument"
        elif str(self.dist.get("rank", "")).isdigit():  # an int, or "3" in some writers; -1 means unknown
            rank, source = int(self.dist["rank"]), "distributedInfo"
        else:
            m = _FILE_RANK.search(os.path.basename(self.path))
            if m:
                rank, source = int(m.group(1)), "file name"
            elif not self.dist:
                rank, source = 0, "assumed: no distributedInfo (single-process profile)"
            else:
                raise DagprofError("distributedInfo has no rank and the file name carries none (name it rank-N...json or pass rank=)", self.path)
        world = self.dist.get("world_size")
        if not (str(world).isdigit() and int(world) > 0):
            sizes = [int(pg.get("pg_size", 0)) for pg in self.dist.get("pg_config") or [] if isinstance(pg, dict)]
            world = max(sizes + [rank + 1])
        return rank, max(int(world), rank + 1), source

    def _rank_trace(self, flows: np.ndarray) -> RankTrace:
        rank, world, source = self._identity()
        if "0" in self.group_names and "0" not in self.group_ranks:
            self.group_ranks["0"] = list(range(world))  # the default group spans the job
        lanes = self._lanes()
        table = EventTable.from_columns(
            self.names, name=self.pair_name[self.pair], kind=self.kind, lane=self.lane, start=self.start,
            dur=self.dur, depth=self.depth, step=self.step, nbytes=self.nbytes, group=self.group, seq=self.seq,
        )
        base = self.trace.baseTimeNanoseconds or 0
        meta = {"format": "kineto", "rank_source": source, "collectives": self.coll_meta, "explicit_seq": self.explicit_seq,
                "schema": raw_value(self.trace.schemaVersion)}
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


def _as_int(value: Any, default: Any) -> Any:
    return value if isinstance(value, int) and value >= 0 else default


def _intern_ids(values: list[Any]) -> tuple[np.ndarray, list[Any]]:
    """Like ``_intern`` for pids / tids: one numpy sort when they are all ints (the usual case)."""
    try:
        arr = np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        ids, table = _intern(values)
        return ids, list(table)
    uniq, inv = np.unique(arr, return_inverse=True)
    return inv.astype(np.int32).reshape(-1), uniq.tolist()


def _intern(values: list[Any]) -> tuple[np.ndarray, dict[Any, int]]:
    """Ids in first-seen order; hashing str objects is cached, so this is one dict probe per value."""
    ids = {v: i for i, v in enumerate(dict.fromkeys(values))}
    return np.fromiter(map(ids.__getitem__, values), np.int32, len(values)), ids
