"""TensorFlow and JAX profiles (``*.xplane.pb``) -> ``RankTrace``: ops per thread, collectives, step markers.

What the profiler records on a CPU host (TF 2.21, JAX 0.10), and how it maps on ``events.py``:

- one ``XLine`` per thread of the ``/host:CPU`` plane -> one lane. The thread holding the step
  markers (``train`` ranges with a ``step_num`` stat: Keras ``fit``, ``tf.profiler.experimental.Trace``,
  ``jax.profiler.StepTraceAnnotation``) is the main lane;
- ops are the nodes: TF kernels are events named ``<node>:<OpType>`` whose metadata's display
  name is the op type (``sequential_1/conv1_1/Relu:_MklNativeFusedConv2D``); XLA thunks carry an
  ``hlo_op`` stat. Layer = the first two scopes of the node name, ``gradient_tape/`` (or
  ``gradients/``) marks BACKWARD, an optimizer scope UPDATE (its concat/split around the
  all-reduce: MEMCPY, gradient packing);
- collectives: TF's ``CollectiveReduceV2`` & co. on ``collective_ops`` threads, matched across
  workers by ``group_key`` (group) and ``instance_key`` (seq, the same on every worker); XLA's
  ``all-reduce*`` & co., matched by step and position in the step;
- dependencies between threads come from the thread pools' own records: every task a pool
  runs is a ``ThreadpoolListener::StartRegion`` whose context id names the
  ``ThreadpoolListener::Record`` of the thread that scheduled it. The task's first op depends on
  the op that was running (or had just run) where it was scheduled; a task without ops passes
  that dependency on to the tasks it schedules. This gives launch -> op, op -> collective
  (through the collective executor's closures), collective -> update ops, exactly as run;
- the main lane is partitioned per step into host segments (cut where it schedules work) and a
  COMM_WAIT where it blocks until that work is done: the innermost main-thread range that
  contains the moment the last op of the work ended (TF ``KernelAndDeviceFunc::Run``, JAX
  ``block_until_ready``);
- times: µs since the ``Task Environment`` plane's ``profile_start_time`` (Unix ns), which
  is ``base_ns``: workers on one clock before any alignment.

Not read (yet): device planes (GPU/TPU streams), tensor sizes (the trace has no shapes: a
collective's ``nbytes`` is 0 unless the run folder's rank file gives the gradient bytes), tf.data
pipelines beyond the ops that wait for them.
"""
from __future__ import annotations

import gzip
import os
import re
import zlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import DagprofError
from .events import EventTable, Kind, Lane, LaneKind, RankTrace
from .xplane_decode import MISSING, XLine, XPlane, XSpace, decode_xspace

HOST_PLANE = "/host:CPU"
TASK_ENV_PLANE = "Task Environment"
METADATA_PLANE = "/host:metadata"
_RECORD, _START, _STOP = "ThreadpoolListener::Record", "ThreadpoolListener::StartRegion", "ThreadpoolListener::StopRegion"
_ASYNC_START = "ExecutorState::ProcessAsync::Start"  # an executor thread starting an async kernel (a collective)

TF_COLLECTIVES = {
    "CollectiveReduce": "allreduce", "CollectiveReduceV2": "allreduce", "CollectiveReduceV3": "allreduce",
    "CollectiveGather": "allgather", "CollectiveGatherV2": "allgather",
    "CollectiveReduceScatterV2": "reducescatter",
    "CollectiveBcastSend": "broadcast", "CollectiveBcastRecv": "broadcast",
    "CollectiveBcastSendV2": "broadcast", "CollectiveBcastRecvV2": "broadcast",
    "CollectiveAllToAllV2": "alltoall", "CollectiveAllToAllV3": "alltoall",
    "NcclAllReduce": "allreduce",
}
_XLA_COLLECTIVE = re.compile(r"^(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|collective-broadcast)(-start)?\b")
_XLA_CANON = {"all-reduce": "allreduce", "all-gather": "allgather", "reduce-scatter": "reducescatter",
              "all-to-all": "alltoall", "collective-permute": "sendrecv", "collective-broadcast": "broadcast"}
_OPTIMIZER = re.compile(r"^(sgd|adam|adamw|adamax|nadam|rmsprop|adagrad|adadelta|ftrl|lamb|lion|momentum|optimizer|"
                        r"gradientdescent|loss_scale_optimizer)(_\d+)?$", re.I)
_PACKING = {"ConcatV2", "Concat", "Pack", "SplitV", "Split", "Unpack"}
_XLA_SEQ_PER_STEP = 1_000_000  # XLA collectives: seq = step * this + position within the step


def read_xplane(path: str | os.PathLike[str], rank: int | None = None, world_size: int | None = None,
                grad_bytes: int = 0) -> RankTrace:
    """One worker's ``*.xplane.pb``. ``rank``/``world_size`` come from the run folder (the file has
    neither); without them the rank is taken from the path (``worker1``, ``rank-1``, ``p1``...)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as err:
        raise DagprofError(f"cannot read ({err.strerror})", path) from None
    if buf[:2] == b"\x1f\x8b":
        try:
            buf = gzip.decompress(buf)
        except (OSError, EOFError, zlib.error) as err:
            raise DagprofError(f"corrupt or truncated gzip ({type(err).__name__})", path) from None
    if not buf:
        raise DagprofError("empty file (the profiler was stopped before it wrote anything?)", path)
    space = decode_xspace(buf, path)
    host = space.plane(HOST_PLANE)
    if host is None:
        from .formats import describe  # noqa: PLC0415  (only for the error message)

        names = ", ".join(p.name for p in space.planes[:5]) or "none"
        raise DagprofError(f"no {HOST_PLANE} plane in this XPlane file (planes: {names}){describe(path, 'xplane')}", path)
    return _Reader(space, host, path, rank, world_size, grad_bytes).build()


def rank_from_path(path: str) -> int | None:
    """``.../worker1/...``, ``rank-2``, ``task_0``, ``p3``, ``w1``: the last such path component."""
    for part in reversed(os.path.normpath(path).split(os.sep)):
        m = re.fullmatch(r"(?:worker|rank|task|process|proc|replica|host|p|w)[-_]?(\d+)", part, re.I)
        if m:
            return int(m.group(1))
    return None


@dataclass
class _LaneOps:
    """The depth-0 nodes of one lane, sorted by start."""

    rows: np.ndarray  # indices into the event table
    start: np.ndarray
    region_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # index of the task region per node, -1 none


@dataclass
class _Region:
    """One task a thread pool ran on a lane: StartRegion .. StopRegion."""

    lane: int
    start: float
    end: float
    ctx: tuple[int, int]  # (context type, id) of the producer that scheduled it


class _Reader:
    def __init__(self, space: XSpace, plane: XPlane, path: str, rank: int | None, world: int | None, grad_bytes: int):
        self.space, self.plane, self.path = space, plane, path
        self.rank_arg, self.world_arg, self.grad_bytes = rank, world, grad_bytes
        self.warnings: list[str] = []
        env = space.plane(TASK_ENV_PLANE)
        self.base_ns = int(env.stats.get("profile_start_time", 0)) if env is not None else 0
        if not self.base_ns:
            self.warnings.append("no profile_start_time (Task Environment plane): workers cannot be put on one clock before alignment")
        meta = space.plane(METADATA_PLANE)
        jax_version = meta.stats.get("jax_version") if meta is not None else None
        self.framework = "jax" if jax_version else "tensorflow"
        self.framework_version = str(jax_version or "")
        busy_devices = [p.name for p in space.planes if p.name.startswith("/device:") and any(len(x.offset_ps) for x in p.lines)]
        if busy_devices:
            self.warnings.append(f"device planes not read yet (host ops only): {', '.join(busy_devices[:4])}")

    # ------------------------------------------------------------------ columns
    def build(self) -> RankTrace:
        p = self.plane
        names = p.event_names
        display = p.event_display
        self.lines = [ln for ln in p.lines if len(ln.offset_ps)]
        # per line: times in us since base, metadata names
        self.t0 = [(ln.timestamp_ns * 1000 + ln.offset_ps) / 1e6 for ln in self.lines]
        self.t1 = [t + ln.duration_ps / 1e6 for t, ln in zip(self.t0, self.lines)]
        op_meta = {mid for mid, d in display.items() if d and names.get(mid, "").endswith(":" + d)}
        special = {name: {mid for mid, n in names.items() if n == name} for name in (_RECORD, _START, _STOP)}
        self.main = self._main_line(special)
        step_rows, step_nums = self.steps
        # op rows per line (and the points where an executor thread issued a collective)
        self.op_rows: list[np.ndarray] = []
        self.issues: dict[tuple[int, int], str] = {}  # (line, row) -> the collective's node name
        async_start = [m for m, n in names.items() if n == _ASYNC_START]
        for k, ln in enumerate(self.lines):
            is_op = np.isin(ln.metadata_id, list(op_meta)) if op_meta else np.zeros(len(ln.metadata_id), bool)
            maybe = ~is_op & ~np.isin(ln.metadata_id, list(special[_RECORD] | special[_START] | special[_STOP]))
            maybe &= ln.stats_span[:, 1] > ln.stats_span[:, 0]
            if maybe.any():
                cand = np.flatnonzero(maybe)
                hlo = self.space.int_stat(p, ln, cand, "hlo_op")
                is_op[cand[hlo != MISSING]] = True
            starts = np.flatnonzero(np.isin(ln.metadata_id, async_start)) if async_start and k != self.main else []
            if len(starts):
                ktype = self.space.int_stat(p, ln, starts, "kernel_type")
                node = self.space.int_stat(p, ln, starts, "name")
                for row, kt, nm in zip(starts.tolist(), ktype.tolist(), node.tolist()):
                    if p.stat_names.get(kt, "") in TF_COLLECTIVES:
                        self.issues[(k, row)] = p.stat_names.get(nm, "collective")
                        is_op[row] = True
            self.op_rows.append(np.flatnonzero(is_op))
        self._table(step_rows, step_nums, special)
        return self._rank_trace()

    def _main_line(self, special: dict[str, set[int]]) -> int:
        """The line with the most step markers (events with a ``step_num`` stat)."""
        best, best_rows, best_nums = -1, np.zeros(0, np.int64), np.zeros(0, np.int64)
        skip = list(special[_RECORD] | special[_START] | special[_STOP])
        for k, ln in enumerate(self.lines):
            cand = np.flatnonzero((ln.stats_span[:, 1] > ln.stats_span[:, 0]) & ~np.isin(ln.metadata_id, skip))
            nums = self.space.int_stat(self.plane, ln, cand, "step_num")
            has = nums != MISSING
            if has.sum() > len(best_rows):
                best, best_rows, best_nums = k, cand[has], nums[has]
        if best < 0:
            raise DagprofError(
                "no step markers: wrap each training step in tf.profiler.experimental.Trace('train', step_num=i, _r=1) "
                "(Keras fit and dagprof's collectors do) or jax.profiler.StepTraceAnnotation('train', step_num=i)", self.path)
        # one marker per step: the longest range with that number (Keras and a user's own may nest)
        dur = self.t1[best][best_rows] - self.t0[best][best_rows]
        order = np.lexsort((-dur, best_nums))
        keep = order[np.r_[True, np.diff(best_nums[order]) != 0]] if len(order) else order
        rows, nums = best_rows[keep], best_nums[keep]
        by_time = np.argsort(self.t0[best][rows], kind="stable")
        rows, nums = rows[by_time], nums[by_time]
        if len(np.unique(nums)) < len(nums) or np.any(np.diff(nums) <= 0):
            self.warnings.append("step numbers repeat or go backwards (several epochs in the window?): steps renumbered in time order")
            nums = nums[0] + np.arange(len(nums)) if len(nums) else nums
        self.steps = (rows, nums.astype(np.int64))
        return best

    # ------------------------------------------------------------------ events
    def _table(self, step_rows: np.ndarray, step_nums: np.ndarray, special: dict[str, set[int]]) -> None:
        p, names = self.plane, self.plane.event_names
        self.names: list[str] = []
        self.name_index: dict[str, int] = {}
        cols: dict[str, list] = {c: [] for c in EventTable.COLUMNS}
        self.cols = cols
        main = self.main
        s0 = self.t0[main][step_rows]
        s1 = self.t1[main][step_rows]
        self.step_start, self.step_end, self.step_num = s0, s1, step_nums
        # lanes: lines with ops, plus the main line
        self.lane_of: dict[int, int] = {}
        self.lanes: list[Lane] = []
        for k, ln in enumerate(self.lines):
            if k == main or len(self.op_rows[k]):
                self.lane_of[k] = len(self.lanes)
                kind = LaneKind.COMM_THREAD if "collective" in ln.name.lower() else LaneKind.CPU_THREAD
                self.lanes.append(Lane(ln.display_name or ln.name, kind, main=k == main))
        for j in range(len(step_rows)):
            self._add(f"train step {int(step_nums[j])}", Kind.STEP, main, float(s0[j]), float(s1[j] - s0[j]), depth=-1, step=int(step_nums[j]))
        self.collectives: dict[str, list] = {"event": [], "coll": [], "dtype": []}
        self.group_sizes = self._group_sizes()
        self.xla_seq: dict[int, int] = {}
        lane_nodes: dict[int, list[int]] = {}
        for k in self.lane_of:
            lane_nodes[k] = self._ops_of_line(k)
        self.lane_nodes = lane_nodes
        self._flows(special)
        self._main_lane()

    def _add(self, name: str, kind: Kind, line: int, start: float, dur: float, depth: int = 0, step: int = -1,
             layer: int = -1, nbytes: int = 0, group: int = -1, seq: int = -1) -> int:
        i = self.name_index.get(name)
        if i is None:
            i = self.name_index[name] = len(self.names)
            self.names.append(name)
        c = self.cols
        for col, v in (("name", i), ("kind", int(kind)), ("lane", self.lane_of[line]),
                       ("start", start), ("dur", max(dur, 0.0)), ("depth", depth), ("step", step), ("layer", layer),
                       ("nbytes", nbytes), ("group", group), ("seq", seq), ("bucket", -1)):
            c[col].append(v)
        return len(c["start"]) - 1

    def _step_of(self, t: np.ndarray) -> np.ndarray:
        """The step whose marker range holds each time (-1 outside every step)."""
        k = np.searchsorted(self.step_start, t, side="right") - 1
        kk = np.clip(k, 0, None)
        inside = (k >= 0) & (t <= self.step_end[kk])
        return np.where(inside, self.step_num[kk], -1)

    def _ops_of_line(self, k: int) -> list[int]:
        """Add the op events of line ``k``; returns the depth-0 ones (table rows) in time order."""
        ln = self.lines[k]
        rows = self.op_rows[k]
        if not len(rows):
            return []
        start, end = self.t0[k][rows], self.t1[k][rows].copy()
        issue = np.array([(k, int(r)) in self.issues for r in rows], dtype=bool)
        end[issue] = start[issue]  # the range lasts until the collective's closure ends: only its start is the issue
        order = np.lexsort((-(end - start), start))
        rows, start, end = rows[order], start[order], end[order]
        steps = self._step_of(start)
        depth = np.zeros(len(rows), np.int16)
        stack: list[float] = []
        for j in range(len(rows)):  # nesting: an op inside another (a function call op run inline) is not a node
            while stack and stack[-1] <= start[j]:
                stack.pop()
            depth[j] = len(stack)
            stack.append(end[j])
        p = self.plane
        names, display = p.event_names, p.event_display
        coll_rows = [j for j in range(len(rows)) if self._collective_kind(names[ln.metadata_id[rows[j]]], display.get(ln.metadata_id[rows[j]], ""))]
        keys = {}
        if coll_rows:
            sub = rows[coll_rows]
            keys = {s: (self.space.int_stat(p, ln, sub, s)) for s in ("group_key", "instance_key")}
        out = []
        layers: dict[str, int] = getattr(self, "layer_index", {})
        self.layer_index = layers
        for j in range(len(rows)):
            mid = ln.metadata_id[rows[j]]
            full = names.get(int(mid), "")
            op_type = display.get(int(mid), "")
            node = full[: -len(op_type) - 1] if op_type and full.endswith(":" + op_type) else full
            coll = self._collective_kind(full, op_type)
            step = int(steps[j])
            issued = self.issues.get((k, int(rows[j])))
            if issued is not None:
                i = self._add(f"issue {issued}", Kind.COMM_ENQUEUE, k, float(start[j]), 0.0, int(depth[j]), step)
            elif coll:
                ci = coll_rows.index(j)
                gkey = int(keys["group_key"][ci]) if keys and keys["group_key"][ci] != MISSING else None
                ikey = int(keys["instance_key"][ci]) if keys and keys["instance_key"][ci] != MISSING else None
                group = self._group(f"tf{gkey}" if gkey is not None else "0")
                seq = ikey if ikey is not None else self._xla_seq(step)
                i = self._add(node, Kind.COMM, k, float(start[j]), float(end[j] - start[j]), int(depth[j]), step, group=group, seq=seq)
                self.collectives["event"].append(i)
                self.collectives["coll"].append(coll)
                self.collectives["dtype"].append("")
            else:
                kind, layer = self._classify(node, op_type)
                li = -1
                if layer:
                    li = layers.setdefault(layer, len(layers))
                i = self._add(node, kind, k, float(start[j]), float(end[j] - start[j]), int(depth[j]), step, layer=li)
            if depth[j] == 0:
                out.append(i)
        return out

    @staticmethod
    def _collective_kind(full: str, op_type: str) -> str:
        if op_type:
            return TF_COLLECTIVES.get(op_type, "")
        m = _XLA_COLLECTIVE.match(full)
        return _XLA_CANON[m.group(1)] if m else ""

    def _gradient_bytes(self) -> None:
        """Put the run folder's gradient bytes on the gradient all-reduce of each step.

        The trace has no tensor sizes. Candidates are all-reduces outside any scope or in an
        optimizer's (a loss or metric is reduced under its own scope, e.g. ``div_no_nan/``); of
        those, the name with the longest median duration carries the gradients.
        """
        if not self.grad_bytes:
            return
        c = self.cols
        by_name: dict[str, list[int]] = {}
        for i, coll in zip(self.collectives["event"], self.collectives["coll"]):
            node = self.names[c["name"][i]]
            head = node.split("/", 1)[0] if "/" in node else ""
            if coll == "allreduce" and (not head or _OPTIMIZER.match(head)):
                by_name.setdefault(node, []).append(i)
        if not by_name:
            return
        best = max(by_name, key=lambda n: float(np.median([c["dur"][i] for i in by_name[n]])))
        for i in by_name[best]:
            c["nbytes"][i] = int(self.grad_bytes)

    def _xla_seq(self, step: int) -> int:
        k = self.xla_seq.get(step, 0)
        self.xla_seq[step] = k + 1
        return max(step, 0) * _XLA_SEQ_PER_STEP + k

    def _group(self, name: str) -> int:
        groups = getattr(self, "groups", None)
        if groups is None:
            groups = self.groups = []
        if name not in groups:
            groups.append(name)
        return groups.index(name)

    def _group_sizes(self) -> dict[str, int]:
        """group_key -> group_size, from the collective executor's CompleteParams ranges."""
        p = self.plane
        mids = [m for m, n in p.event_names.items() if n == "CollectiveExecutor::CompleteParams"]
        out: dict[str, int] = {}
        for ln in self.lines:
            rows = np.flatnonzero(np.isin(ln.metadata_id, mids)) if mids else np.zeros(0, np.int64)
            if len(rows):
                keys = self.space.int_stat(p, ln, rows, "group_key")
                sizes = self.space.int_stat(p, ln, rows, "group_size")
                for gk, gs in zip(keys.tolist(), sizes.tolist()):
                    if gk != MISSING and gs != MISSING:
                        out[f"tf{gk}"] = int(gs)
        return out

    @staticmethod
    def _classify(node: str, op_type: str) -> tuple[Kind, str]:
        """Kind and layer from a TF node name (XLA thunk names carry no layer: KERNEL)."""
        if not op_type:
            return Kind.KERNEL, ""
        parts = node.split("/")
        backward = parts[0] in ("gradient_tape", "gradients")
        if backward:
            parts = parts[1:]
        if parts and _OPTIMIZER.match(parts[0]):
            return (Kind.MEMCPY if op_type in _PACKING else Kind.UPDATE), ""
        layer = "/".join(parts[:2]) if len(parts) >= 3 else ""
        if backward:
            return Kind.BACKWARD, layer
        return (Kind.FORWARD if layer else Kind.OTHER), layer

    # ------------------------------------------------------------------ flows
    def _flows(self, special: dict[str, set[int]]) -> None:
        """Who scheduled each task, resolved to ops (see the module doc).

        Tasks are thread-pool regions (StartRegion .. StopRegion, named by their Record) and, on
        threads outside instrumented pools (TF's collective executor), the outermost ranges that
        consume a producer's context (``_p``/``_pt`` -> ``_c``/``_ct``).
        """
        p = self.plane
        start = np.asarray(self.cols["start"])
        self.flows: list[tuple[int, int]] = []
        regions: list[_Region] = []
        records: dict[tuple[int, int], tuple[int, float]] = {}  # (context type, id) -> (line, time) of its producer
        consumers: list[tuple[int, float, float, tuple[int, int]]] = []
        pool = 15  # tsl::profiler::ContextType::kThreadpoolEvent
        for k, ln in enumerate(self.lines):
            md = ln.metadata_id
            rec = np.flatnonzero(np.isin(md, list(special[_RECORD])))
            if len(rec):
                for c, t in zip(self.space.int_stat(p, ln, rec, "_p").tolist(), self.t0[k][rec].tolist()):
                    if c != MISSING:
                        records[(pool, c)] = (k, t)
            sr = np.flatnonzero(np.isin(md, list(special[_START])))
            stops = np.sort(self.t0[k][np.isin(md, list(special[_STOP]))])
            for c, t in zip(self.space.int_stat(p, ln, sr, "_c").tolist(), self.t0[k][sr].tolist()):
                j = np.searchsorted(stops, t, side="left")
                regions.append(_Region(k, t, float(stops[j]) if j < len(stops) else float("inf"), (pool, c)))
            other = np.flatnonzero((ln.stats_span[:, 1] > ln.stats_span[:, 0]) & ~np.isin(md, list(special[_RECORD] | special[_START])))
            if len(other):
                pid, ptype = self.space.int_stat(p, ln, other, "_p"), self.space.int_stat(p, ln, other, "_pt")
                cid, ctype = self.space.int_stat(p, ln, other, "_c"), self.space.int_stat(p, ln, other, "_ct")
                for j in np.flatnonzero(pid != MISSING).tolist():
                    records.setdefault((int(ptype[j]), int(pid[j])), (k, float(self.t0[k][other[j]])))
                for j in np.flatnonzero(cid != MISSING).tolist():
                    consumers.append((k, float(self.t0[k][other[j]]), float(self.t1[k][other[j]]), (int(ctype[j]), int(cid[j]))))
        pooled: dict[int, list[_Region]] = {}
        for r in regions:
            pooled.setdefault(r.lane, []).append(r)
        outer: dict[int, float] = {}  # line -> end of the last consumer range kept
        inner: dict[int, list[tuple[int, int]]] = {}  # pool region -> the contexts consumed inside it, in time order
        pool_index = {id(r): i for i, r in enumerate(regions)}
        for k, t0, t1, ctx in sorted(consumers, key=lambda c: (c[0], c[1], -c[2])):
            host = next((r for r in pooled.get(k, ()) if r.start <= t0 <= r.end), None)
            if host is not None:  # inside a pool task: its Record says who scheduled it, these are the fallback
                inner.setdefault(pool_index[id(host)], []).append(ctx)
                continue
            if t0 < outer.get(k, -np.inf):
                continue  # inside a consumer range kept
            outer[k] = t1
            regions.append(_Region(k, t0, t1, ctx))
        region_at: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for k in {r.lane for r in regions}:
            ids = sorted((i for i, r in enumerate(regions) if r.lane == k), key=lambda i: regions[i].start)
            region_at[k] = (np.array([regions[i].start for i in ids]), np.array(ids, dtype=np.int64))
        self.regions = regions
        nodes_at = {k: (start[v] if v else np.zeros(0), np.asarray(v, np.int64)) for k, v in self.lane_nodes.items()}

        def region_of(k: int, t: float) -> int:
            if k not in region_at:
                return -1
            starts, ids = region_at[k]
            j = int(np.searchsorted(starts, t, side="right")) - 1
            return int(ids[j]) if j >= 0 and regions[ids[j]].end >= t else -1

        memo: dict[int, tuple] = {}

        def source_at(k: int, t: float) -> tuple:
            """("node", row) | ("main", time) | ("none",): what was running where a task was scheduled."""
            if k == self.main:
                return ("main", t)
            r = region_of(k, t)
            lo = regions[r].start if r >= 0 else -np.inf
            if k in nodes_at:
                st, rows = nodes_at[k]
                j = int(np.searchsorted(st, t, side="right")) - 1
                if j >= 0 and st[j] >= lo:
                    return ("node", int(rows[j]))
            return effective(r) if r >= 0 else ("none",)

        def producers(r: int) -> list[tuple[int, float]]:
            """Where region ``r`` was scheduled from: its own producer, then (when that is a thread
            nobody scheduled, e.g. a network completion queue) those of the contexts it consumes."""
            return [records[c] for c in [regions[r].ctx, *inner.get(r, [])] if c in records]

        def effective(r: int) -> tuple:
            if r in memo:
                return memo[r]
            memo[r] = ("none",)  # guards against a malformed cycle
            for rec in producers(r):
                memo[r] = source_at(*rec)
                if memo[r][0] != "none":
                    break
            return memo[r]

        # first op of every task <- what was running where it was scheduled; the dispatch (a main-lane
        # time) each op descends from, for the main thread's waits. Ops in start order, so a source's
        # dispatch is known before its dependants'.
        kind = np.asarray(self.cols["kind"])
        self.main_sources: list[tuple[float, int]] = []  # (main-lane time, destination row)
        self.dispatch_of: dict[int, float] = {}  # op row -> the main-lane time it descends from
        items = []
        for k, (st, rows) in nodes_at.items():
            if k != self.main:
                reg = [region_of(k, float(t)) for t in st]
                items += [(float(st[j]), int(rows[j]), reg[j], j == 0 or reg[j - 1] != reg[j]) for j in range(len(rows))]
        items.sort()
        prev_in_region: dict[int, int] = {}
        comm_rows = set(np.flatnonzero(kind == Kind.COMM).tolist())
        for t, row, r, first in items:
            src: tuple = ("none",)
            if r >= 0 and first:
                src = effective(r)
            elif r >= 0:
                src = ("node", prev_in_region[r])
            if src[0] == "none" and row in comm_rows:
                src = self._last_before(row, items)  # its scheduling was not recorded (a window cut through it)
            if r >= 0:
                prev_in_region[r] = row
            if src[0] == "main":
                self.dispatch_of[row] = src[1]
                if first:
                    self.main_sources.append((src[1], row))
            elif src[0] == "node":
                u = src[1]
                if u in self.dispatch_of:
                    self.dispatch_of[row] = self.dispatch_of[u]
                if (first or r < 0) and u != row and start[u] <= t + 1e-3:
                    self.flows.append((u, row))
        # a collective on a thread that also computes (XLA on CPU) blocks that thread
        for k, (st, rows) in nodes_at.items():
            for j in np.flatnonzero(kind[rows] == Kind.COMM).tolist():
                if j > 0:
                    self.flows.append((int(rows[j - 1]), int(rows[j])))
                if j + 1 < len(rows):
                    self.flows.append((int(rows[j]), int(rows[j + 1])))

    def _last_before(self, row: int, items: list) -> tuple:
        """The op of the same step (off the main thread) that ended last before ``row`` started."""
        start, dur, step = self.cols["start"], self.cols["dur"], self.cols["step"]
        best, best_end = ("none",), -np.inf
        for t, u, _r, _f in items:
            if t >= start[row]:
                break
            e = start[u] + dur[u]
            if u != row and step[u] == step[row] and best_end < e <= start[row] + 1e-3:
                best, best_end = ("node", u), e
        return best

    # ------------------------------------------------------------------ the main lane
    def _main_lane(self) -> None:
        """Host segments cut at every dispatch, and a wait where the thread blocked on the dispatched work."""
        main = self.main
        ln = self.lines[main]
        c = self.cols
        start = np.asarray(c["start"])
        end = start + np.asarray(c["dur"])
        # raw main-thread ranges (for names and the blocking call), without markers
        skip = {m for m, n in self.plane.event_names.items() if n in (_RECORD, _START, _STOP)}
        keep = ~np.isin(ln.metadata_id, list(skip))
        r0, r1 = self.t0[main][keep], self.t1[main][keep]
        rnames = [self.plane.event_names.get(int(m), "") for m in ln.metadata_id[keep]]
        step_rows = set(self.steps[0].tolist())
        is_step = np.array([i in step_rows for i in np.flatnonzero(keep)], dtype=bool)
        # completion of each dispatch's work
        done: dict[float, tuple[float, int]] = {}
        for row, d in self.dispatch_of.items():
            if d not in done or end[row] > done[d][0]:
                done[d] = (float(end[row]), row)
        dispatch_times = sorted({t for t, _ in self.main_sources})
        waits: list[tuple[float, float, str, list[int]]] = []
        for d, (t_done, row) in sorted(done.items()):
            before = [t for t in dispatch_times if t <= t_done]
            inside = np.flatnonzero((r0 <= t_done) & (r1 >= t_done) & ~is_step)
            if len(inside):
                j = inside[np.argmin(r1[inside] - r0[inside])]  # innermost
                w0 = max(float(r0[j]), before[-1] if before else float(r0[j]))
                waits.append((w0, float(r1[j]), rnames[j], [row]))
                continue
            # nothing traced on the main thread spans that moment: it was blocked in untraced code
            # from its last range before the work ended to its first range after (or the step's end)
            k = int(np.searchsorted(self.step_start, t_done, side="right")) - 1
            if k < 0 or t_done > self.step_end[k]:
                continue
            ended = r1[(r1 <= t_done) & ~is_step]
            later = r0[(r0 >= t_done) & ~is_step]
            w0 = max(float(ended.max()) if len(ended) else float(self.step_start[k]), before[-1] if before else -np.inf)
            w1 = min(float(later.min()) if len(later) else np.inf, float(self.step_end[k]))
            if w1 > w0:
                waits.append((w0, w1, "(untraced)", [row]))
        merged: list[tuple[float, float, str, list[int]]] = []
        for w in sorted(waits):
            if merged and w[0] < merged[-1][1]:
                a = merged[-1]
                merged[-1] = (a[0], max(a[1], w[1]), a[2], a[3] + w[3])
            else:
                merged.append(w)
        main_ops = self.lane_nodes.get(main, [])
        segs: list[tuple[float, float, int]] = []
        for j in range(len(self.step_start)):
            s0, s1, step = float(self.step_start[j]), float(self.step_end[j]), int(self.step_num[j])
            cuts = {s0, s1}
            cuts.update(t for t in dispatch_times if s0 < t < s1)
            my_waits = [w for w in merged if s0 <= w[0] < s1]
            for w in my_waits:
                cuts.update((w[0], min(w[1], s1)))
            ops = [i for i in main_ops if s0 <= start[i] < s1]
            for i in ops:
                cuts.update((float(start[i]), min(float(end[i]), s1)))
            bounds = sorted(cuts)
            for a, b in zip(bounds[:-1], bounds[1:]):
                if b <= a:
                    continue
                if any(start[i] <= a and end[i] >= b for i in ops):
                    continue  # an op executed on the main thread: already a node
                w = next((w for w in my_waits if w[0] <= a and b <= w[1]), None)
                if w is not None:
                    i = self._add(f"wait: {w[2]}", Kind.COMM_WAIT, main, a, b - a, step=step)
                    self.flows.extend((row, i) for row in w[3])
                    continue
                inner = np.flatnonzero((r0 <= a) & (r1 >= b) & ~is_step)
                label = rnames[inner[np.argmin(r1[inner] - r0[inner])]] if len(inner) else "python"
                segs.append((a, b, self._add(f"host: {label}", Kind.OTHER, main, a, b - a, step=step)))
        segs.sort()
        seg_end = np.array([b for _, b, _ in segs])
        seg_start = np.array([a for a, _, _ in segs])
        for t, dst in self.main_sources:
            # the segment that ends where the work was scheduled (else the one that holds that moment)
            j = int(np.searchsorted(seg_end, t - 1e-6, side="left")) if len(segs) else -1
            if 0 <= j < len(segs) and seg_start[j] <= t + 1e-6:
                self.flows.append((segs[j][2], dst))

    # ------------------------------------------------------------------ result
    def _rank_trace(self) -> RankTrace:
        self._gradient_bytes()
        rank = self.rank_arg if self.rank_arg is not None else rank_from_path(self.path)
        if rank is None:
            rank = 0
            self.warnings.append("rank not given and not in the path (worker1/, rank-1...): taken as 0")
        groups = getattr(self, "groups", [])
        world = self.world_arg or max(self.group_sizes.values(), default=1)
        group_ranks = {g: list(range(self.group_sizes.get(g, world))) for g in groups}
        ev = EventTable.from_columns(self.names, **self.cols)
        layers = sorted(self.layer_index, key=self.layer_index.get) if hasattr(self, "layer_index") else []
        flows = np.asarray(sorted(set(self.flows)), dtype=np.int64).reshape(-1, 2)
        meta = {
            "format": "xplane", "framework": self.framework, "framework_version": self.framework_version,
            "collectives": self.collectives, "explicit_seq": True, "warnings": self.warnings,
            "steps_profiled": [int(s) for s in self.step_num],
        }
        return RankTrace(rank=int(rank), world_size=int(world), source=self.path, events=ev, lanes=self.lanes,
                         base_ns=self.base_ns, host=(self.space.hostnames or [""])[0],
                         backend="gloo" if self.framework == "jax" else "grpc-ring", layers=layers, groups=groups,
                         group_ranks=group_ranks, flows=flows, meta=meta)
