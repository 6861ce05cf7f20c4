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
- dependencies between threads come from the thread pools' own scheduling records
  (``xplane_flows``): a task's first op depends on the op that was running where the task was
  scheduled. This gives launch -> op, op -> collective (through the collective executor's
  closures), collective -> update ops, as they ran. An executor thread's
  ``ExecutorState::ProcessAsync::Start`` of a collective is a COMM_ENQUEUE node (its issue), so
  collectives TF orders one after another chain through it; a collective completes when its
  callbacks start (they release the ops after it and may then run for another millisecond);
- the main lane is partitioned per step into host segments (cut where it schedules work) and a
  COMM_WAIT where it blocks until that work is done: the innermost main-thread range that
  contains the moment the last op of the work ended (TF ``KernelAndDeviceFunc::Run``, JAX
  ``block_until_ready``);
- times: µs since the ``Task Environment`` plane's ``profile_start_time`` (Unix ns), which
  is ``base_ns``: workers on one clock before any alignment.

Not read (yet): device planes (GPU/TPU streams), tensor shapes (the ops' events have none: a TF
collective's ``nbytes`` comes from the rank file's sizes read from the traced graph, the memory tracer's
allocations of 256 KiB and more, or a sparse gradient's lookup's traced id count; else it is 0), tf.data
pipelines beyond the ops that wait for them.
"""
from __future__ import annotations

import os
import re

import numpy as np

from ..errors import DagprofError
from ..fsutil import read_input
from ..intervals import union
from . import formats
from .events import CommKind, CommRole, EventRows, Kind, Lane, LaneKind, RankTrace, intern, nested
from .host_segments import HostSegments, flatten
from .meta import Collectives, RankMeta, RunWarning
from .rank_warnings import merged_figures
from .tf_xplane_names import OPTIMIZER, TF_COLLECTIVES, classify, collective_kind, layer_names, program_collectives
from .xplane_decode import MISSING, XPlane, XSpace, decode_xspace
from .xplane_flows import POOL, Line, schedule
from .xplane_layout import LOOKUP_ALTERNATIVES, CollectiveSizes

HOST_PLANE = "/host:CPU"
TASK_ENV_PLANE = "Task Environment"
METADATA_PLANE = "/host:metadata"
_RECORD, _START, _STOP = "ThreadpoolListener::Record", "ThreadpoolListener::StartRegion", "ThreadpoolListener::StopRegion"
_ASYNC_START = "ExecutorState::ProcessAsync::Start"  # an executor thread starting an async kernel (a collective)
NO_RUN_ID = -1  # XLA's RunId a caller left unset (TF's XlaLaunch passes it for every run)
_RUN_WAIT = "ThunkExecutor::Execute (wait for completion)"  # XLA's client thread waiting for a program run (``run_id``) to finish
# TF's ``tf.function(jit_compile=True)``: the executor thread runs the program's thunks inline inside this range, then waits
# in ``_TF_RUN_WAIT`` for the thunks the Eigen threads run; every run has run id -1 (``_tf_launches``)
_TF_LAUNCH, _TF_RUN_WAIT = "CpuExecutable::ExecuteAsyncOnStream", "BlockUntilReady"
_PJRT_LAUNCH = "ExecuteHelper"  # in the name of PjRt's program launch on the calling thread (``ExecuteHelperOnSingleDevice``)
# an async kernel's completion callbacks, run inside the collective's range on its thread
_DONE = ("CollectiveExecutor::ExecuteAsync::Done", "ExecutorState::ProcessAsync::Done")
_TICK_US = 1.0  # an op that ended this close before another started ended before it (the trace's times are rounded)
_TRAIN_MARKER = "train"  # the step marker of Keras fit, tf_profile and jax_profile (tf.profiler Trace / StepTraceAnnotation)

# The branch TF's ``all_reduce_indexed_slices`` all-gathers a sparse gradient's rows and indices in (``cond/then/``, or
# ``cond/else/`` where the workers' row counts differ); the length all-gathered before it, outside the branch, is 4 bytes.
_SPARSE_BRANCH = re.compile(r"(?:^|/)cond(?:_\d+)?/(?:then|else)/")
_PAD_BRANCH = re.compile(r"(?:^|/)cond(?:_\d+)?/else/")  # the branch that pads each worker's rows to the most any has
_BRANCH_CALL = re.compile(r"(/(?:then|else))/_\d+/")  # a lowered ``If`` branch's call node: ``cond_1/then/_18/``
# the scopes control flow and calls add to a node's name: ``cond/then/_416/``, ``while/body/_1/``, the ``cond/``, ``while/``
# name scopes of the ops inside, a ``tf.function`` called from another (``StatefulPartitionedCall/``):
# ``while/body/_1/while/StatefulPartitionedCall/cond/then/_698/cond/adam/CollectiveReduceV2``
_CONTROL_FLOW = re.compile(r"(?:^|(?<=/))(?:(?:cond|while)(?:_\d+)?/(?:(?:then|else|body)/_\d+/)?|(?:Stateful)?PartitionedCall(?:_\d+)?/)+")
_VARIABLE_READ = re.compile(r"(?:ReadVariableOp|/Cast(?:_\d+)?)$")
# XLA's CPU compiler, outermost ranges (TF's jit_compile and JAX's jit alike); a compile's codegen threads are not counted
XLA_COMPILE = ("CpuCompiler::RunBackend", "CpuCompiler::RunHloPasses", "JitCompiler::Compile")
_XLA_SEQ_PER_STEP = 1_000_000  # XLA collectives: seq = step * this + position within the step


def read_xplane(path: str | os.PathLike[str], rank: int | None = None, world_size: int | None = None,
                grad_bytes: int = 0, sizes: CollectiveSizes | None = None, window: list[int] | None = None,
                embedding_grad_bytes: int = 0) -> RankTrace:
    """One worker's ``*.xplane.pb``. ``rank``/``world_size`` come from the run folder (the file has
    neither); without them the rank is taken from the path (``worker1``, ``rank-1``, ``p1``...).
    ``sizes``: what the run folder says each collective op sends (``xplane_layout.CollectiveSizes``; None: nothing).
    ``window``: the steps the collector profiled, as it numbered them (the rank file's ``steps_profiled``)."""
    path = os.fspath(path)
    formats.expect(path, "xplane")  # a Kineto/Horovod/MXNet file given here says what it looks like
    buf = read_input(path)  # gunzips *.xplane.pb.gz
    if not buf:
        raise DagprofError("empty file (the profiler was stopped before it wrote anything?)", path)
    space = decode_xspace(buf, path)
    host = space.plane(HOST_PLANE)
    if host is None:
        names = ", ".join(p.name for p in space.planes[:5]) or "none"
        raise DagprofError(f"no {HOST_PLANE} plane in this XPlane file (planes: {names})", path)
    return _Reader(space, host, path, rank, world_size, grad_bytes, sizes or CollectiveSizes(), window or [], embedding_grad_bytes).build()


_MERGED = ("an epoch ends inside the window", "XLA compiled programs inside")  # per-rank warnings said once for the job


def merge_rank_figures(ranks: list[RankTrace]) -> None:
    """Say once for the job what every rank sees in the same words but its own figures (an epoch's end inside the window:
    12283 and 12285 ms between the epochs; XLA's compiles inside the steps): each such warning (``_MERGED``) is rewritten
    with every figure as the ranks' range (in place)."""
    found = [(t, k, w.what) for t in ranks for k, w in enumerate(t.meta.warnings) if w.what.startswith(_MERGED)]
    for (t, k, _), what in zip(found, merged_figures([what for _, _, what in found])):
        t.meta.warnings[k] = RunWarning(what)


def rank_from_path(path: str) -> int | None:
    """``.../worker1/...``, ``rank-2``, ``task_0``, ``p3``, ``w1``: the last such path component."""
    for part in reversed(os.path.normpath(path).split(os.sep)):
        m = re.fullmatch(r"(?:worker|rank|task|process|proc|replica|host|p|w)[-_]?(\d+)", part, re.I)
        if m:
            return int(m.group(1))
    return None


class _Reader:
    def __init__(self, space: XSpace, plane: XPlane, path: str, rank: int | None, world: int | None, grad_bytes: int,
                 sizes: CollectiveSizes, window: list[int], embedding_grad_bytes: int = 0):
        self.space, self.plane, self.path = space, plane, path
        self.rank_arg, self.world_arg, self.grad_bytes = rank, world, grad_bytes
        self.embedding_grad_bytes = embedding_grad_bytes
        self.sizes, self.window = sizes, window
        self.warnings: list[str] = []
        self.groups: list[str] = []
        self.group_index: dict[str, int] = {}
        self.layer_index: dict[str, int] = {}  # op scope -> id, until ``_layers`` makes them layers
        self.scopes: dict[str, tuple[bool, bool]] = {}  # op scope -> (has a gradient op, reads a variable)
        self.tab = EventRows()
        self.collectives = Collectives()
        self.step_id_of: dict[int, int] = {}  # TF collective event -> its executor step id (the memory tracer's ``id``)
        self.padded_rows: dict[int, tuple[int, int]] = {}  # TF: a sparse gradient's all-gather -> (this worker's rows, bytes a row): ``_output_bytes``
        self.host_segments: HostSegments | None = None  # the main thread's labelled time: ``_main_lane``
        self.run_rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # run ids, table rows, is a run's wait: ``_run_completions``
        env = space.plane(TASK_ENV_PLANE)
        self.base_ns = int(env.stats.get("profile_start_time", 0)) if env is not None else 0
        if not self.base_ns:
            self.warnings.append("no profile_start_time (Task Environment plane): workers cannot be put on one clock before alignment")
        meta = space.plane(METADATA_PLANE)
        jax_version = meta.stats.get("jax_version") if meta is not None else None
        self.framework = "jax" if jax_version else "tensorflow"
        self.framework_version = str(jax_version or "")
        self.programs = program_collectives(space, meta) if meta is not None else {}
        self.operands_per_step: float | None = None  # ``_program_bytes``
        busy_devices = [p.name for p in space.planes if p.name.startswith("/device:") and any(len(x.offset_ps) for x in p.lines)]
        if busy_devices:
            self.warnings.append(f"device planes not read yet (host ops only): {', '.join(busy_devices[:4])}")

    def mids(self, *names: str) -> list[int]:
        return [m for m, n in self.plane.event_names.items() if n in names]

    # ------------------------------------------------------------------ ops
    def build(self) -> RankTrace:
        p = self.plane
        names, display = p.event_names, p.event_display
        self.lines = [ln for ln in p.lines if len(ln.offset_ps)]
        self.t0 = [(ln.timestamp_ns * 1000 + ln.offset_ps) / 1e6 for ln in self.lines]  # us since base_ns
        self.t1 = [t + ln.duration_ps / 1e6 for t, ln in zip(self.t0, self.lines)]
        self.markers = self.mids(_RECORD, _START, _STOP)
        self.main = self._main_line()
        self._compiles()
        op_meta = [m for m, d in display.items() if d and names.get(m, "").endswith(":" + d)]
        async_start, done = self.mids(_ASYNC_START), self.mids(*_DONE)
        self.run_waits = self.mids(_RUN_WAIT, *((_TF_RUN_WAIT,) if self.framework == "tensorflow" else ()))
        self.launches = self._tf_launches()
        op_rows, self.issues = [], {}
        for k, ln in enumerate(self.lines):
            is_op = np.isin(ln.metadata_id, op_meta) | (np.isin(ln.metadata_id, self.run_waits) & (k != self.main))
            cand = np.flatnonzero(~is_op & ~np.isin(ln.metadata_id, self.markers) & (ln.stats_span[:, 1] > ln.stats_span[:, 0]))
            if len(cand):
                is_op[cand[self.space.int_stat(p, ln, cand, "hlo_op") != MISSING]] = True  # XLA thunks
            starts = np.flatnonzero(np.isin(ln.metadata_id, async_start)) if k != self.main else np.zeros(0, np.int64)
            if len(starts):  # where an executor thread issued a collective
                ktype, node = self.space.int_stat(p, ln, starts, "kernel_type"), self.space.int_stat(p, ln, starts, "name")
                for row, kt, nm in zip(starts.tolist(), ktype.tolist(), node.tolist()):
                    if p.stat_names.get(kt, "") in TF_COLLECTIVES:
                        self.issues[(k, row)] = p.stat_names.get(nm, "collective")
                        is_op[row] = True
            op_rows.append(np.flatnonzero(is_op))
        self.done_at = [np.sort(self.t0[k][np.isin(ln.metadata_id, done)]) for k, ln in enumerate(self.lines)]
        self.lane_of: dict[int, int] = {}
        self.lanes: list[Lane] = []
        for k, ln in enumerate(self.lines):
            if k == self.main or len(op_rows[k]):
                self.lane_of[k] = len(self.lanes)
                kind = LaneKind.COMM_THREAD if "collective" in ln.name.lower() else LaneKind.CPU_THREAD
                self.lanes.append(Lane(ln.display_name or ln.name, kind, main=k == self.main, pool=k != self.main))  # the rest: pools
        s0, s1 = self.step_start, self.step_end
        self.tab.add_block(name=np.array([self.tab.intern(f"train step {int(n)}") for n in self.step_num], dtype=np.int64),
                           kind=np.full(len(s0), int(Kind.STEP)), lane=np.full(len(s0), self.lane_of[self.main]),
                           start=s0, dur=s1 - s0, depth=np.full(len(s0), -1), step=self.step_num)
        self.group_sizes = self._group_sizes()
        self.nodes = {k: self._ops_of_line(k, op_rows[k]) for k in self.lane_of}
        self._split_loops()
        self._flows()
        self._run_steps()
        self._main_lane()
        return self._rank_trace()

    def _main_line(self) -> int:
        """The line with the most step markers (events with a ``step_num`` stat); sets the steps."""
        best, best_rows, best_nums = -1, np.zeros(0, np.int64), np.zeros(0, np.int64)
        for k, ln in enumerate(self.lines):
            cand = np.flatnonzero((ln.stats_span[:, 1] > ln.stats_span[:, 0]) & ~np.isin(ln.metadata_id, self.markers))
            nums = self.space.int_stat(self.plane, ln, cand, "step_num")
            has = nums != MISSING
            if has.sum() > len(best_rows):
                best, best_rows, best_nums = k, cand[has], nums[has]
        if best < 0:
            raise DagprofError(
                "no step markers: wrap each training step in tf.profiler.experimental.Trace('train', step_num=i, _r=1) "
                "(Keras fit and dagprof's collectors do) or jax.profiler.StepTraceAnnotation('train', step_num=i)", self.path)
        # training steps only: Keras marks its validation batches "test" (and predict's "predict") with step numbers of their
        # own, which would otherwise take the place of training steps of the same number
        marker = np.array([self.plane.event_names.get(m, "") for m in self.lines[best].metadata_id[best_rows].tolist()])
        names, counts = np.unique(marker, return_counts=True)
        train = _TRAIN_MARKER if _TRAIN_MARKER in names else names[np.argmax(counts)]
        if len(names) > 1:
            others = ", ".join(f"{n!r} x{c}" for n, c in zip(names.tolist(), counts.tolist()) if n != train)
            self.warnings.append(f"step markers other than the training step's ({train!r}) left out of the steps: {others}")
        best_rows, best_nums = best_rows[marker == train], best_nums[marker == train]
        # one marker per step: the outermost of ranges that nest (Keras and a user's own may), in time order; never one per
        # number: two epochs in a window reuse the numbers, and each worker kept the longer of a pair, not always the same one
        t0, t1 = self.t0[best][best_rows], self.t1[best][best_rows]
        order = np.lexsort((t0 - t1, t0))
        outer = np.r_[True, t0[order][1:] >= np.maximum.accumulate(t1[order])[:-1]]
        rows, nums = best_rows[order][outer], best_nums[order][outer]
        # Keras numbers each epoch's batches from 0, the collector (its loop timing too) the window's steps over epochs: a
        # marker per profiled step, in order, takes the collector's number; else numbered on from the window's first marker
        window = self.window
        by_window = len(window) == len(nums) and bool(np.all(np.diff(window) == 1))
        glob = np.asarray(window, dtype=np.int64) if by_window else nums[0] + np.arange(len(nums))
        restart = np.flatnonzero(np.diff(nums) <= 0)
        if by_window:
            nums = glob
        if len(restart):
            # what runs between two epochs (validation, epoch-end callbacks, the first validation's tracing) is no training
            # step's, yet a step is timed start to start (traces.steps.iteration_us): keep the window's steps of one epoch
            # only, the most (the first of equals: the same on every worker)
            bounds = np.r_[0, restart + 1, len(nums)]
            k = int(np.argmax(np.diff(bounds)))
            keep = slice(int(bounds[k]), int(bounds[k + 1]))
            gap_ms = float(np.sum(self.t0[best][rows[restart + 1]] - self.t1[best][rows[restart]])) / 1e3
            dropped = np.setdiff1d(glob, glob[keep])
            self.warnings.append(f"an epoch ends inside the window (after step {', '.join(str(int(glob[i])) for i in restart)}: the step "
                                 f"numbers restart), {gap_ms:.0f} ms between the epochs (validation, epoch-end callbacks): steps "
                                 f"{', '.join(map(str, dropped.tolist()))} of another epoch left out; profile steps within one epoch "
                                 f"to keep them all")
            rows, nums = rows[keep], glob[keep]
        self.step_start, self.step_end = self.t0[best][rows], self.t1[best][rows]
        self.step_num = nums.astype(np.int64)
        self.step_rows = rows
        return best

    def _compiles(self) -> None:
        """Warn where XLA compiled inside the profiled steps: the step waits for it, the replay keeps it as gaps on the
        compiling thread (framework overhead, "another thread") and every what-if keeps it as profiled. Keras'
        ``compile(jit_compile=True)`` under MultiWorkerMirroredStrategy compiled the train step again in every step, profiled
        or not (2026-12-06, ``bench/frameworks/tf_tft_forecast_fit.py --jit`` on one worker: 6.6 s of a 10.3 s step, the
        unprofiled steps 5.9-27 s, 36 ms without XLA); ``analyze`` had shown it only as "another thread, before other compute op"."""
        self.compiles = np.zeros((0, 2))
        mids = self.mids(*XLA_COMPILE)
        if not mids:
            return
        spans = []
        for k, ln in enumerate(self.lines):
            rows = np.flatnonzero(np.isin(ln.metadata_id, mids))
            if len(rows):
                spans.append(union(self.t0[k][rows], self.t1[k][rows]))  # a thread's nested compiles counted once
        if not spans:
            return
        span = np.concatenate(spans)
        self.compiles = union(span[:, 0], span[:, 1])  # threads compiling at once: once (``passes.average_steps`` keeps it per step)
        a = np.maximum(span[:, :1], self.step_start[None, :])
        b = np.minimum(span[:, 1:], self.step_end[None, :])
        per_step = np.clip(b - a, 0, None).sum(0)  # compile time inside each step (threads compiling at once each count)
        steps = int((per_step > 0).sum())
        if steps:
            step_ms = float((self.step_end - self.step_start).mean()) / 1e3
            self.warnings.append(f"XLA compiled programs inside {steps} of {len(per_step)} profiled steps, {per_step.sum() / 1e3 / len(per_step):.0f} "
                                 f"ms a step of {step_ms:.0f} ms: the replay keeps the compiles as time on the compiling thread (framework "
                                 "overhead, another thread) and every what-if keeps them as profiled; a program compiled again each step "
                                 "(seen with Keras' compile(jit_compile=True) under MultiWorkerMirroredStrategy) costs every step that")

    def _tf_launches(self) -> np.ndarray:
        """TF's XLA program launches, ``(start, end)`` by start, us: each ``_TF_LAUNCH`` range on any thread. A thunk or wait
        of run id -1 starts inside its launch's range (the thunks the Eigen threads run too: the launch waits for them)."""
        mids = self.mids(_TF_LAUNCH) if self.framework == "tensorflow" else []
        spans = [np.stack([self.t0[k][r], self.t1[k][r]], 1) for k, ln in enumerate(self.lines)
                 if len(r := np.flatnonzero(np.isin(ln.metadata_id, mids)))]
        if not spans:
            return np.zeros((0, 2))
        span = np.concatenate(spans)
        return span[np.argsort(span[:, 0], kind="stable")]

    def _launch_of(self, t: np.ndarray) -> np.ndarray:
        """A run id for ops of run id -1 starting at ``t``: ``-2 - i`` for the ``i``-th launch whose range alone holds the time,
        else -1 (no launch, or launches that overlap: which one ran it is not told)."""
        lo = self.launches
        if not len(lo):
            return np.full(len(t), NO_RUN_ID, dtype=np.int64)
        i = np.searchsorted(lo[:, 0], t, side="right") - 1
        ii = np.clip(i, 0, None)
        inside = (i >= 0) & (t <= lo[ii, 1])
        # the launch before a holder must have ended first (launches that overlap leave their ops unassigned)
        prev_end = np.where(ii > 0, lo[np.clip(ii - 1, 0, None), 1], -np.inf)
        alone = inside & (prev_end < lo[ii, 0]) & ((ii + 1 >= len(lo)) | (lo[np.clip(ii + 1, 0, len(lo) - 1), 0] > lo[ii, 1]))
        return np.where(alone, -2 - ii, NO_RUN_ID).astype(np.int64)

    def _step_of(self, t: np.ndarray) -> np.ndarray:
        """The step whose marker range holds each time (-1 outside every step)."""
        k = np.searchsorted(self.step_start, t, side="right") - 1
        kk = np.clip(k, 0, None)
        return np.where((k >= 0) & (t <= self.step_end[kk]), self.step_num[kk], -1)

    def _ops_of_line(self, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add the op events of line ``k``; returns (starts, table rows) of its depth-0 ones, by start."""
        if not len(rows):
            return np.zeros(0), np.zeros(0, np.int64)
        ln, p = self.lines[k], self.plane
        start, end = self.t0[k][rows], self.t1[k][rows].copy()
        issue = np.array([(k, int(r)) in self.issues for r in rows], dtype=bool) if self.issues else np.zeros(len(rows), bool)
        end[issue] = start[issue]  # its range lasts until the collective's closure ends: only its start is the issue
        order = np.lexsort((-(end - start), start))
        rows, start, end, issue = rows[order], start[order], end[order], issue[order]
        # nesting: an op inside another (a function call op run inline) is not a node
        depth = nested(start, end).astype(np.int16)
        step = self._step_of(start)
        # per distinct op (metadata): name, kind, layer, collective
        uniq, inv = np.unique(ln.metadata_id[rows], return_inverse=True)
        program = self.space.int_stat(p, ln, rows, "program_id") if self.programs else np.full(len(rows), MISSING)
        program_u = np.full(len(uniq), MISSING, dtype=np.int64)  # per distinct op: a program one of its rows ran in
        ran = program != MISSING
        program_u[inv[ran]] = program[ran]
        name_u, kind_u, layer_u, coll_u, role_u = [], [], [], [], []
        for mid, prog in zip(uniq.tolist(), program_u.tolist()):
            full, op_type = p.event_names.get(mid, ""), p.event_display.get(mid, "")
            node = full[: -len(op_type) - 1] if op_type and full.endswith(":" + op_type) else full
            inst = self.programs.get(prog, {}).get(full)
            coll = collective_kind(full, op_type, inst.opcode if inst is not None else "")
            kind, layer = (Kind.COMM, "") if coll else classify(node, op_type)
            if layer:
                seen = self.scopes.get(layer, (False, False))
                self.scopes[layer] = (seen[0] or kind == Kind.BACKWARD, seen[1] or op_type == "ReadVariableOp")
            name_u.append(self.tab.intern(node))
            kind_u.append(int(kind))
            layer_u.append(self.layer_index.setdefault(layer, len(self.layer_index)) if layer else -1)
            coll_u.append(coll)
            # MultiWorkerMirroredStrategy all-gathers a sparse gradient's (IndexedSlices') values and indices, each rank the
            # rows its step touched: more ranks gather more (``CommRole.SPARSE``, as DDP's sparse buckets); XLA's gather shards
            role_u.append(int(CommRole.SPARSE if op_type and coll == CommKind.ALL_GATHER else CommRole.PLAIN))
        name, kind, layer = np.array(name_u)[inv], np.array(kind_u)[inv], np.array(layer_u)[inv]
        for j in np.flatnonzero(issue).tolist():
            name[j], kind[j], layer[j] = self.tab.intern(f"issue {self.issues[(k, int(rows[j]))]}"), int(Kind.COMM_ENQUEUE), -1
        waiting = np.isin(ln.metadata_id[rows], self.run_waits)
        kind[waiting] = int(Kind.COMM_WAIT)  # until its run's last op ends (``_run_completions``)
        group, seq = np.full(len(rows), -1), np.full(len(rows), -1, dtype=np.int64)
        comm = np.flatnonzero((kind == Kind.COMM) & ~issue)
        if len(comm):
            gkey = self.space.int_stat(p, ln, rows[comm], "group_key")
            ikey = self.space.int_stat(p, ln, rows[comm], "instance_key")
            group[comm] = [intern(self.group_index, self.groups, f"tf{g}" if g != MISSING else "0") for g in gkey.tolist()]
            seq[comm] = np.where(ikey != MISSING, ikey, -1)  # XLA: numbered per step once every line is read
            # complete when its callbacks start (they release the ops after it, then may run for a while)
            marks = self.done_at[k]
            m = np.searchsorted(marks, start[comm], side="right")
            mm = np.clip(m, 0, max(len(marks) - 1, 0))
            if len(marks):
                end[comm] = np.where((m < len(marks)) & (marks[mm] < end[comm]), marks[mm], end[comm])
        out = self.tab.add_block(name=name, kind=kind, lane=np.full(len(rows), self.lane_of[k]), start=start, dur=end - start,
                                 depth=depth, step=step, layer=layer, group=group, seq=seq,
                                 comm_kind=np.array(coll_u, dtype=np.uint8)[inv], role=np.array(role_u)[inv])
        run = self.space.int_stat(p, ln, rows, "run_id")
        # TF's ``tf.function(jit_compile=True)`` runs its XLA program with run id -1 in every step (none given): as one run,
        # every step's thunks went in the window's first step (``_run_steps``); each launch is a run of its own here
        unset = np.flatnonzero((run == NO_RUN_ID) | (waiting & (run == MISSING)))  # TF's ``BlockUntilReady`` has no run id
        if len(unset):
            run[unset] = self._launch_of(start[unset])
        known = (run != MISSING) & (run != NO_RUN_ID)
        self.run_rows.append((run[known], out[known], waiting[known]))
        step_ids = self.space.int_stat(p, ln, rows[comm], "step_id") if len(comm) else np.zeros(0, np.int64)
        for j, prog, sid in zip(comm.tolist(), program[comm].tolist(), step_ids.tolist()):
            if sid != MISSING:
                self.step_id_of[int(out[j])] = int(sid)
            self.collectives.event.append(int(out[j]))
            self.collectives.kind.append(coll_u[inv[j]])
            self.collectives.dtype.append("")
            self.collectives.program.append(int(prog))
        top = depth == 0
        return start[top], out[top]

    def _group_sizes(self) -> dict[str, int]:
        """group_key -> group_size, from the collective executor's CompleteParams ranges."""
        p, mids = self.plane, self.mids("CollectiveExecutor::CompleteParams")
        out: dict[str, int] = {}
        for ln in self.lines:
            rows = np.flatnonzero(np.isin(ln.metadata_id, mids))
            if len(rows):
                keys, sizes = self.space.int_stat(p, ln, rows, "group_key"), self.space.int_stat(p, ln, rows, "group_size")
                out.update({f"tf{g}": int(n) for g, n in zip(keys.tolist(), sizes.tolist()) if g != MISSING and n != MISSING})
        return out

    # ------------------------------------------------------------------ flows
    def _flows(self) -> None:
        """Scheduling records of every thread -> dependencies between ops (``xplane_flows``)."""
        p = self.plane
        rec, start, stop = self.mids(_RECORD), self.mids(_START), self.mids(_STOP)
        lines: dict[int, Line] = {}
        for k, ln in enumerate(self.lines):
            md, t0, t1 = ln.metadata_id, self.t0[k], self.t1[k]
            line = lines[k] = Line()
            r = np.flatnonzero(np.isin(md, rec))
            line.records = [(t, (POOL, c)) for t, c in zip(t0[r].tolist(), self.space.int_stat(p, ln, r, "_p").tolist()) if c != MISSING]
            sr = np.flatnonzero(np.isin(md, start))
            stops = np.sort(t0[np.isin(md, stop)])
            j = np.searchsorted(stops, t0[sr], side="left")
            ends = np.where(j < len(stops), stops[np.clip(j, 0, max(len(stops) - 1, 0))] if len(stops) else np.inf, np.inf)
            line.tasks = [(a, b, (POOL, c)) for a, b, c in zip(t0[sr].tolist(), ends.tolist(), self.space.int_stat(p, ln, sr, "_c").tolist())]
            other = np.flatnonzero((ln.stats_span[:, 1] > ln.stats_span[:, 0]) & ~np.isin(md, rec + start))
            if len(other):
                pid, ptype = self.space.int_stat(p, ln, other, "_p"), self.space.int_stat(p, ln, other, "_pt")
                cid, ctype = self.space.int_stat(p, ln, other, "_c"), self.space.int_stat(p, ln, other, "_ct")
                ok = pid != MISSING
                line.records += [(t, (a, b)) for t, a, b in zip(t0[other][ok].tolist(), ptype[ok].tolist(), pid[ok].tolist())]
                ok = cid != MISSING
                line.consumers = [(a, b, (c, d)) for a, b, c, d in
                                  zip(t0[other][ok].tolist(), t1[other][ok].tolist(), ctype[ok].tolist(), cid[ok].tolist())]
        c = self.tab.columns()
        self.sched = schedule(lines, self.nodes, self.main, c["start"], c["start"] + c["dur"], c["kind"], c["step"])
        self.tab.flows += self.sched.flows
        self.tab.flows += self._run_completions(c)

    def _run_steps(self) -> None:
        """An XLA program run dispatched outside every step belongs to none, wherever its ops' times fall. A program
        dispatched between steps (an evaluation pass every few steps) runs on after the next step's marker begins on a
        rank that did not wait for its result, and its all-reduce, timed inside that step there and between the steps
        on the rank that read the result, took the step's first collective position on one rank only ("mismatched
        collectives"). A run's ops carry the main-thread moment their chain of tasks descends from (``xplane_flows``);
        runs queued behind a busy device inherit the chain of the run before them, so only a chain's first run was
        dispatched at that moment: it takes that moment's step, every other run its first op's.

        Where that moment lies outside every step and outside every program launch of the main thread (``_PJRT_LAUNCH``),
        and the main thread launched one after it, before the run began, the run waited for that moment's work (a copy),
        not dispatched by it: it takes that launch's step. PjRt starts a program whose inputs are still being copied in
        from the copy's task: on a profile of
        ``bench/frameworks/jax_clip_gather.py`` (``tests/data/tf-jax/clip-h2d-late``) rank 1's step-10 batch copy, put on
        the pool between steps, ran 1 ms late, inside step 10, and the step's program, launched inside it, ran from that
        task: its ops, collectives among them, were in no step there ("mismatched collectives", the job refused)."""
        if not self.run_rows:
            return
        runs = np.concatenate([r for r, _, _ in self.run_rows])
        rows = np.concatenate([t for _, t, _ in self.run_rows])
        c = self.tab.columns()
        chain = self.sched.dispatch[rows]
        ids, inv = np.unique(runs, return_inverse=True)
        first, root = np.full(len(ids), np.inf), np.full(len(ids), np.inf)
        np.minimum.at(first, inv, c["start"][rows])
        known = ~np.isnan(chain)
        np.minimum.at(root, inv[known], chain[known])
        step = self._step_of(first)
        led = np.isfinite(root)
        launch_start, launch_end = self._main_launches()
        for d in np.unique(root[led]).tolist():
            mine = np.flatnonzero(root == d)
            lead = mine[np.argmin(first[mine])]
            at = self._step_of(np.array([d]))[0]
            later = launch_start[(launch_start > d) & (launch_start <= first[lead])]
            if at < 0 and len(later) and not ((launch_start <= d) & (d <= launch_end)).any():
                at = self._step_of(later[-1:])[0]
            step[lead] = at
        c["step"][rows] = step[inv]

    def _main_launches(self) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends), us, by start, of the main thread's PjRt program launches (``_PJRT_LAUNCH``)."""
        mids = [m for m, n in self.plane.event_names.items() if _PJRT_LAUNCH in n]
        on = np.isin(self.lines[self.main].metadata_id, mids)
        start, end = self.t0[self.main][on], self.t1[self.main][on]
        order = np.argsort(start, kind="stable")
        return start[order], end[order]

    def _run_completions(self, c: dict[str, np.ndarray]) -> list[tuple[int, int]]:
        """XLA's client thread runs a program's ops inline, then waits for the run (``run_id``) to complete before it
        goes on (``_RUN_WAIT``, a wait node of its thread): the wait ends with the run's last op, whichever thread ran it.
        No scheduling record says so, so the wait was the gap of whatever followed it, on that thread or scheduled from
        it (``tf-jax/fsdp-conv``: the gradient-accumulating ``add`` program 0.1 ms after the loss program's last op on that
        thread in one step, 42 ms in the next, while the loss program's all-reduce on an Eigen thread waited for the other
        rank), and the averaged replay spread that gap over every step besides the all-reduce's own averaged wait."""
        if not self.run_rows:
            return []
        runs = np.concatenate([r for r, _, _ in self.run_rows])
        rows = np.concatenate([t for _, t, _ in self.run_rows])
        wait = np.concatenate([w for _, _, w in self.run_rows])
        if not wait.any():
            return []
        end = c["start"][rows] + c["dur"][rows]
        op = ~wait
        order = np.lexsort((end[op], runs[op]))
        last = {int(r): int(v) for r, v in zip(runs[op][order].tolist(), rows[op][order].tolist())}  # run -> its op that ended last
        return [(last[int(r)], int(v)) for r, v in zip(runs[wait].tolist(), rows[wait].tolist()) if int(r) in last]

    # ------------------------------------------------------------------ the main lane
    def _main_lane(self) -> None:
        """Host segments cut at every dispatch, and a wait where the thread blocked on the dispatched work."""
        main, ln, tab = self.main, self.lines[self.main], self.tab
        c = tab.columns()
        start, end = c["start"], c["start"] + c["dur"]
        sched = self.sched
        # raw main-thread ranges (names, the blocking call), without scheduling markers and step markers
        keep = ~np.isin(ln.metadata_id, self.markers)
        keep[self.step_rows] = False
        r0, r1 = self.t0[main][keep], self.t1[main][keep]
        order = np.argsort(r0, kind="stable")
        r0, r1 = r0[order], r1[order]
        rnames = [self.plane.event_names.get(int(m), "") for m in ln.metadata_id[keep][order]]
        self.host_segments = flatten(r0, r1, rnames)  # what the thread did between its ops (``analysis.overhead``)
        dispatch_times = np.array(sorted({t for t, _ in sched.main_sources}))
        # when each dispatch's work was done: its last op
        d = sched.dispatch
        has = np.flatnonzero(~np.isnan(d))
        waits: list[tuple[float, float, str, list[int]]] = []
        if len(has):
            by = has[np.lexsort((end[has], d[has]))]
            last = by[np.r_[d[by][1:] != d[by][:-1], True]]
            for row in last.tolist():
                w = self._wait(float(end[row]), r0, r1, rnames, dispatch_times)
                if w is not None:
                    waits.append((*w, [row]))
        merged: list[tuple[float, float, str, list[int]]] = []
        for w in sorted(waits):
            if merged and w[0] < merged[-1][1]:  # one blocking call waited for both: named by the one that ends last
                a = merged[-1]
                merged[-1] = (a[0], max(a[1], w[1]), a[2] if a[1] >= w[1] else w[2], a[3] + w[3])
            else:
                merged.append(w)
        main_st, main_rows = self.nodes.get(main, (np.zeros(0), np.zeros(0, np.int64)))
        flows = tab.flows
        segs: list[tuple[float, float, int]] = []
        wait_start = np.array([w[0] for w in merged])
        for j in range(len(self.step_start)):
            s0, s1, step = float(self.step_start[j]), float(self.step_end[j]), int(self.step_num[j])
            lo, hi = np.searchsorted(r0, s0), np.searchsorted(r0, s1, side="right")
            cuts = {s0, s1}
            cuts.update(dispatch_times[(dispatch_times > s0) & (dispatch_times < s1)].tolist())
            my_waits = [merged[i] for i in np.flatnonzero((wait_start >= s0) & (wait_start < s1))]
            for w in my_waits:
                cuts.update((w[0], min(w[1], s1)))
            ops = main_rows[(main_st >= s0) & (main_st < s1)].tolist()
            for i in ops:
                cuts.update((float(start[i]), min(float(end[i]), s1)))
            bounds = sorted(cuts)
            for a, b in zip(bounds[:-1], bounds[1:]):
                if b <= a or any(start[i] <= a and end[i] >= b for i in ops):
                    continue  # an op run on the main thread is a node already
                w = next((w for w in my_waits if w[0] <= a and b <= w[1]), None)
                if w is not None:
                    i = tab.add(f"wait: {w[2]}", Kind.COMM_WAIT, self.lane_of[main], a, b - a, step=step)
                    flows.extend((row, i) for row in w[3])
                    continue
                inner = lo + np.flatnonzero((r0[lo:hi] <= a) & (r1[lo:hi] >= b))
                label = rnames[inner[np.argmin(r1[inner] - r0[inner])]] if len(inner) else "python"
                segs.append((a, b, tab.add(f"host: {label}", Kind.OTHER, self.lane_of[main], a, b - a, step=step)))
        segs.sort()
        seg_start, seg_end = np.array([a for a, _, _ in segs]), np.array([b for _, b, _ in segs])
        for t, dst in sched.main_sources:
            # the segment that ends where the work was scheduled (else the one that holds that moment)
            j = int(np.searchsorted(seg_end, t - 1e-6, side="left"))
            if j < len(segs) and seg_start[j] <= t + 1e-6:
                flows.append((segs[j][2], dst))

    def _wait(self, t_done: float, r0: np.ndarray, r1: np.ndarray, rnames: list[str],
              dispatch_times: np.ndarray) -> tuple[float, float, str] | None:
        """(start, end, name) of the main thread's wait for work that ended at ``t_done``, or None."""
        k = int(np.searchsorted(self.step_start, t_done, side="right")) - 1
        if k < 0 or t_done > self.step_end[k]:
            return None
        before = dispatch_times[dispatch_times <= t_done]
        last_dispatch = float(before[-1]) if len(before) else -np.inf
        hi = int(np.searchsorted(r0, t_done, side="right"))
        inside = np.flatnonzero(r1[:hi] >= t_done)
        if len(inside):  # the innermost main-thread range around that moment: the blocking call
            j = inside[np.argmin(r1[inside] - r0[inside])]
            return max(float(r0[j]), last_dispatch), float(r1[j]), rnames[j]
        # nothing traced spans it: blocked in untraced code, from its last range before to its first after
        ended = r1[:hi][r1[:hi] <= t_done]
        w0 = max(float(ended.max()) if len(ended) else float(self.step_start[k]), last_dispatch)
        w1 = min(float(r0[hi]) if hi < len(r0) else np.inf, float(self.step_end[k]))
        return (w0, w1, "(untraced)") if w1 > w0 else None

    # ------------------------------------------------------------------ result
    def _rank_trace(self) -> RankTrace:
        c = self.tab.columns()
        self._refuse_looped(c)
        if not self._program_bytes(c):
            self._own_bytes(c)
            self._output_bytes(c)
            self._gradient_bytes(c)
        self._xla_seq(c)
        layers = self._layers(c)
        rank = self.rank_arg if self.rank_arg is not None else rank_from_path(self.path)
        if rank is None:
            rank = 0
            self.warnings.append("rank not given and not in the path (worker1/, rank-1...): taken as 0")
        world = self.world_arg or max(self.group_sizes.values(), default=1)
        group_ranks = {g: list(range(self.group_sizes.get(g, world))) for g in self.groups}
        self._async_loops(c)
        ev = self.tab.table()
        flows = np.unique(self.tab.flow_array(), axis=0)
        meta = RankMeta(format="xplane", framework=self.framework, framework_version=self.framework_version,
                        collectives=self.collectives, explicit_seq=True, warnings=[RunWarning(w) for w in self.warnings],
                        steps_profiled=[int(s) for s in self.step_num], collective_operands_per_step=self.operands_per_step,
                        padded_rows={int(i): list(v) for i, v in self.padded_rows.items()}, host_segments=self.host_segments,
                        xla_compiles=[(float(a), float(b)) for a, b in self.compiles])
        return RankTrace(rank=int(rank), world_size=int(world), source=self.path, events=ev, lanes=self.lanes,
                         base_ns=self.base_ns, host=(self.space.hostnames or [""])[0],
                         backend="gloo" if self.framework == "jax" else "grpc-ring",
                         layers=layers, groups=self.groups,
                         group_ranks=group_ranks, flows=flows, meta=meta)

    def _split_loops(self) -> None:
        """A loop op whose body usually runs on after it, outside it, holds none of it: where it held part of its body (or
        all of it) in a step, its body's ops there are ops of their own, the loop op only its head, up to the first.

        XLA's CPU runtime runs a ``while`` loop's iterations inline until one has to wait, then returns, and the rest go
        on as tasks (``_async_loops``). How many ran inline differs from step to step and rank to rank: a RealNVP flow's
        backward ``fori_loop`` (``bench/frameworks/jax_flow_fori.py``, 8 iterations, one all-reduce each) held 0 to 7 of
        them, its loop op 0.04 to 265 ms, its other all-reduces ops of their own. Such a step held fewer joins of ranks
        than its neighbours, the nested all-reduces timed only as the loop op, and each op's mean over the steps paired
        unlike work: a loop op averaged to tens of ms beside all-reduces averaged over other iterations, and joins
        paired with other iterations' (the averaged replay +2.1 to +17.9 % on 8 runs). Read so, every step holds every
        iteration's ops, each all-reduce a join: -0.23 to +0.32 % on those 8, +0.06 to +0.52 % on 5 fresh runs
        (``tf-jax/lstm-lm-jit``'s scan, 4 of 128 all-reduces inline: +1.44 -> +0.00 %). Before the flows are read, so
        that what a body op released leaves from it. A loop whose body runs inside it in most steps is ``_async_loops``'
        (it nests the others); one whose body never ran outside it keeps it (``tf-jax/scan-rnn``: its collectives timed
        as the loop op, ``Parallelism.looped_dp``)."""
        c = self.tab.columns()
        top, loops, body = _loop_bodies(c, self.lane_of[self.main])
        if not body:
            return
        depth, lane, name, step = c["depth"], c["lane"], c["name"], c["step"]
        start, dur = c["start"], c["dur"]
        went_on = np.array(list(body), dtype=np.int64)
        usual = {int(name[i]) for i in body if _usual(loops, i, name, step, went_on)}
        line_of = {v: k for k, v in self.lane_of.items()}
        touched: set[int] = set()
        for i in loops[np.isin(name[loops], list(usual))].tolist():
            held = np.flatnonzero((lane == lane[i]) & (depth > 0) & (start >= start[i]) & (start < start[i] + dur[i]))
            if not len(held):
                continue
            depth[held] -= 1
            dur[i] = start[held].min() - start[i]
            touched.add(int(lane[i]))
        for ln in touched:  # the line's depth-0 ops again, by start (``_ops_of_line``)
            rows = np.flatnonzero((lane == ln) & (depth == 0))
            rows = rows[np.argsort(start[rows], kind="stable")]
            self.nodes[line_of[ln]] = (start[rows], rows)

    def _async_loops(self, c: dict[str, np.ndarray]) -> None:
        """An XLA op whose body ran on after it ended, outside it, holds that body again, as in the steps where it ran inside.

        XLA's CPU runtime may run a ``while`` loop asynchronously: the loop's thunk returns once an iteration waits, and
        the iterations go on as tasks on any pool thread. The trace then shows the loop op short (19 ms against 340-550
        in the other steps of ``bench/frameworks/jax_scan_rnn.py``) and its body's ops after it, unnested, on another
        thread. Matched with its other steps' loop ops, which hold their body, the short one was averaged up to their
        mean while its body's ops, which no other step has as ops, stayed: the averaged replay counted that step's loop
        twice (+8.8 %; 7 fresh runs +0.1 to +9.8 %). An op's body is the ops nested in it on its thread in some step (by
        name: one parent op each); those of the same step that ran outside every op after it ended become nested in it
        again: it lasts until the last of them ends, the flows they released leave from it, those into them are dropped
        (its own came first), and its thread's wait for the program run, begun meanwhile, is nested too or starts at its
        end. The step then reads as the others do, per step as measured (7 runs: +0.1 to +0.5 %). Where its thread ran
        another op meanwhile, it is named ``<op> (async)`` instead: without a twin among the steps whose loop holds its
        body, it keeps its own time, as its body's ops do (``passes.average_steps``). Only a loop that ran so in fewer of
        its steps than not: where that is its usual way (``tf-jax/lstm-lm-loaded``'s ``while.95``, in every step on both
        ranks: +0.03 %; +26 % with all but one step's body moved), ``_split_loops`` has read every step so already."""
        depth, lane, name, step, kind = c["depth"], c["lane"], c["name"], c["step"], c["kind"]
        start = c["start"]
        end = start + c["dur"]
        top, loops, body = _loop_bodies(c, self.lane_of[self.main])
        if not body:
            return
        went_on = np.array(list(body), dtype=np.int64)
        moved: dict[int, int] = {}  # body row -> its loop op row
        for i, rows in sorted(body.items()):
            if _usual(loops, i, name, step, went_on):  # its usual way: ``_split_loops`` read it so
                continue
            until = float(end[rows].max())
            busy = top[(lane[top] == lane[i]) & (start[top] >= end[i]) & (start[top] < until) & ~np.isin(top, rows)]
            waits = busy[kind[busy] == int(Kind.COMM_WAIT)]  # its thread waiting for the program run, which the loop is part of
            if len(busy) > len(waits):
                name[i] = self.tab.intern(f"{self.tab.names[name[i]]} (async)")
                continue
            c["dur"][i] = until - start[i]
            depth[rows] = 1
            within = waits[end[waits] <= until + _TICK_US]
            depth[within] = 1
            later = waits[end[waits] > until + _TICK_US]  # the wait goes on after the loop: from its end
            c["dur"][later] = end[later] - until
            c["start"][later] = until
            moved.update(dict.fromkeys([*rows, *within.tolist()], i))
        if moved:  # what the body's ops released, the loop op releases; flows into them are its own body's (or its start's)
            self.tab.flows = [(moved.get(u, u), v) for u, v in self.tab.flows if v not in moved and moved.get(u, u) != v]

    def _layers(self, c: dict[str, np.ndarray]) -> list[str]:
        """Op scopes -> layers (``layer_names``), numbered in model order (their first forward compute op); ops of
        no layer (losses, metrics, asserts) are not forward ops of the model."""
        names = layer_names(self.scopes)
        scope_of = sorted(self.layer_index, key=self.layer_index.get)
        raw = c["layer"]
        layer_of_scope = np.array([names.get(s, "") for s in scope_of] + [""], dtype=object)
        per_event = layer_of_scope[np.where(raw >= 0, raw, len(scope_of))]
        # variable reads, and their casts under a mixed-precision policy, all run at the step's start
        reads = np.array([bool(_VARIABLE_READ.search(n)) for n in self.tab.names] + [False])[c["name"]]
        fwd = (c["kind"] == Kind.FORWARD) & (per_event != "") & ~reads
        first: dict[str, float] = {}
        for name, t in zip(per_event[fwd].tolist(), c["start"][fwd].tolist()):
            first[name] = min(first.get(name, np.inf), t)
        order = sorted(set(per_event.tolist()) - {""}, key=lambda n: (first.get(n, np.inf), n))
        index = {n: i for i, n in enumerate(order)}
        c["layer"][:] = [index.get(n, -1) for n in per_event.tolist()]
        c["kind"][(c["kind"] == Kind.FORWARD) & (c["layer"] < 0)] = Kind.OTHER
        return order

    def _program_bytes(self, c: dict[str, np.ndarray]) -> bool:
        """Each XLA collective's bytes from its own instruction in the program (JAX), and the operands the collectives
        carried per profiled step (their median over the steps: ``operands_per_step``); False if none is known."""
        found, per_step, in_loop, origin, devices = False, {}, [], [], []
        for i, prog in zip(self.collectives.event, self.collectives.program):
            inst = self.programs.get(prog, {}).get(self.tab.names[c["name"][i]])
            in_loop.append(inst is not None and inst.in_loop)
            origin.append(inst.origin if inst is not None else "")
            devices.append(inst.devices if inst is not None else "")
            if inst is not None:
                c["nbytes"][i], found = inst.nbytes, True
                if c["step"][i] >= 0:
                    per_step[int(c["step"][i])] = per_step.get(int(c["step"][i]), 0) + inst.operands
        if per_step:
            self.operands_per_step = float(np.median(list(per_step.values())))
        if found:
            self.collectives.in_loop, self.collectives.origin, self.collectives.devices = in_loop, origin, devices
        return found

    def _own_bytes(self, c: dict[str, np.ndarray]) -> None:
        """Each TF collective's bytes from its own input tensor, as the collector read it from the traced graph
        (``collective_bytes``): an all-gather carries its group's inputs (``CommKind.event_bytes``; its result, as the memory
        tracer sizes it).
        Lowered ``If`` branches are looked up without the call's number (``cond_1/then/_18/`` -> ``cond_1/then/``)."""
        for i, coll in zip(self.collectives.event, self.collectives.kind):
            own = self.sizes.nbytes.get(_BRANCH_CALL.sub(r"\1/", self.tab.names[c["name"][i]]))
            if own is not None:
                group = self.groups[c["group"][i]] if c["group"][i] >= 0 else ""
                c["nbytes"][i] = coll.event_bytes(own, self.group_sizes.get(group, self.world_arg or 1))

    def _output_bytes(self, c: dict[str, np.ndarray]) -> None:
        """TF collectives whose result the memory tracer saw allocated (an all-gather's, e.g. a sparse embedding gradient's
        rows) take its size in the same step (the allocation's ``id`` is the op's executor ``step_id``): a sparse gradient's
        row count can change from step to step (``padded_batch`` over ``Input((None,))``). An op with no allocation in its
        step takes the size its others recorded where they all agree (a static shape), else it stays unsized: the tracer
        records no CPU tensor under 256 KiB (TF 2.21's oneDNN allocator hands those out untraced).
        An IndexedSlices gradient's gather of indices (``X_1`` right after the gather ``X`` of its rows, as TF's
        cross-device code sends them) is never seen (int tensors live in host memory, which the tracer does not record):
        it carries one index per gathered row of ``X`` in that step (the rows' recorded shape), each of the bytes the
        collector read from the traced graph (``CollectiveSizes.row_bytes``: its dtype), or, in runs recorded before that, one
        int32 each, said in a warning with its count."""
        p = self.plane
        mids = self.mids("MemoryAllocation")
        names = {self.tab.names[c["name"][i]] for i in self.collectives.event}
        in_step: dict[tuple[str, int], tuple[int, int]] = {}  # (op, step id) -> (bytes, its first dimension, -1 if none)
        sizes: dict[str, set[int]] = {}
        for ln in self.lines:
            rows = np.flatnonzero(np.isin(ln.metadata_id, mids))
            if not len(rows):
                continue
            op, nbytes = self.space.int_stat(p, ln, rows, "tf_op"), self.space.int_stat(p, ln, rows, "requested_bytes")
            region, step_id = self.space.int_stat(p, ln, rows, "region_type"), self.space.int_stat(p, ln, rows, "id")
            for row, o, b, r, k in zip(rows.tolist(), op.tolist(), nbytes.tolist(), region.tolist(), step_id.tolist()):
                name = p.stat_names.get(o, "") if o != MISSING else ""
                if name not in names or b == MISSING or p.stat_names.get(r) != "output":
                    continue
                sizes.setdefault(name, set()).add(int(b))
                if k != MISSING:
                    dims = re.findall(r"\d+", str(self.space.event_stats(p, ln, row).get("shape", "")))
                    in_step[(name, int(k))] = (int(b), int(dims[0]) if len(dims) >= 2 else -1)
        guessed, looked_up = 0, self._lookup_counts()
        for i, coll in zip(self.collectives.event, self.collectives.kind):
            name, sid = self.tab.names[c["name"][i]], self.step_id_of.get(i, MISSING)
            per_row = self.sizes.row_bytes.get(_BRANCH_CALL.sub(r"\1/", name))  # the collector names a branch's ops less the call's number
            if (coll == CommKind.ALL_GATHER and per_row is not None and _SPARSE_BRANCH.search(name)
                    and (ids := self._looked_up(_BRANCH_CALL.sub(r"\1/", name), int(c["step"][i]), looked_up)) is not None):
                self.padded_rows[i] = (ids, per_row)  # its own count in either branch: --workers prices more workers' padding from all
            if c["nbytes"][i]:
                continue
            own, rows_of = in_step.get((name, sid)), in_step.get((name[:-2], sid), (0, -1))[1]
            if own is not None:
                c["nbytes"][i] = own[0]
            elif len(sizes.get(name, ())) == 1 and per_row is None:
                c["nbytes"][i] = next(iter(sizes[name]))
            elif coll == CommKind.ALL_GATHER and name.endswith("_1") and rows_of >= 0:
                c["nbytes"][i] = rows_of * (per_row or 4)
                guessed += per_row is None
            elif per_row is not None and (ids := self._looked_up(_BRANCH_CALL.sub(r"\1/", name), int(c["step"][i]), looked_up)) is not None:
                group = self.groups[c["group"][i]] if c["group"][i] >= 0 else ""
                if _PAD_BRANCH.search(name):  # padded to the most rows any worker has: the run's reader sizes it (``padded_rows``)
                    self.padded_rows[i] = (ids, per_row)
                else:
                    c["nbytes"][i] = self.group_sizes.get(group, self.world_arg or 1) * ids * per_row
        if guessed:
            self.warnings.append(f"{guessed} all-gathers of a sparse gradient's indices, which the memory tracer does not see, "
                                 "sized as one int32 per row of the rows' gather before them")
        sparse = [i for i, coll in zip(self.collectives.event, self.collectives.kind)
                  if coll == CommKind.ALL_GATHER and c["step"][i] >= 0 and _SPARSE_BRANCH.search(self.tab.names[c["name"][i]])]
        unsized = sum(c["nbytes"][i] == 0 and i not in self.padded_rows for i in sparse)
        if unsized:
            why = ("their shape is not static in the traced step (a dynamic row count: padded_batch over Input((None,)), or the "
                   "branch that pads the workers' unequal row counts)" if self.sizes.nbytes else
                   "the run holds no sizes read from the traced step (recorded before 2026-12-03)")
            steps = len({int(c["step"][i]) for i in sparse})
            self.warnings.append(f"{unsized} of {len(sparse)} all-gathers of a sparse gradient (an embedding's rows or indices) in the "
                                 f"{steps} profiled steps ({unsized / steps:g} a step) have no size: {why}, and the memory tracer "
                                 "recorded no allocation of theirs in their step (it skips CPU tensors under 256 KiB), so they are "
                                 "priced as 0 B and a bandwidth or worker-count what-if leaves their bytes out")

    def _lookup_counts(self) -> dict[tuple[str, int], list[int]]:
        """The ids each lookup of ``CollectiveSizes.lookups`` took in each step: the ``total`` of the ``ParallelFor`` its kernel
        ran inside its event (TF's CPU gather shards its ids so, one unit each; none traced where it ran them inline)."""
        wanted = {op for ops in self.sizes.lookups.values() for entry in ops for op in entry.split(LOOKUP_ALTERNATIVES)}
        out: dict[tuple[str, int], list[int]] = {}
        if not wanted:
            return out
        p = self.plane
        node = {m: n.rsplit(":", 1)[0] for m, n in p.event_names.items() if ":" in n and n.rsplit(":", 1)[0] in wanted}
        shards = set(self.mids("ParallelFor"))
        for k, ln in enumerate(self.lines):
            mine = np.flatnonzero(np.isin(ln.metadata_id, list(node)))
            if not len(mine):
                continue
            inner = np.flatnonzero(np.isin(ln.metadata_id, list(shards)))
            total = self.space.int_stat(p, ln, inner, "total")
            t0, t1 = self.t0[k], self.t1[k]
            for row, step in zip(mine.tolist(), self._step_of(t0[mine]).tolist()):
                held = (t0[inner] >= t0[row]) & (t1[inner] <= t1[row]) & (total != MISSING)
                out.setdefault((node[int(ln.metadata_id[row])], int(step)), []).append(int(total[held][0]) if held.sum() == 1 else -1)
        return out

    def _looked_up(self, name: str, step: int, counts: dict[tuple[str, int], list[int]]) -> int | None:
        """The ids a sparse gradient's all-gather ``name`` takes from this worker in ``step``: its lookups' (each run
        once in the step, its count traced; of lookups over the same ids, the first so), else None. TF's branch of equal
        row counts gathers as many from each worker; the branch that pads gathers the most any worker has."""
        entries = self.sizes.lookups.get(name)
        if not entries:
            return None
        seen = [next((n for op in entry.split(LOOKUP_ALTERNATIVES) if len(n := counts.get((op, step), [])) == 1 and n[0] >= 0), [])
                for entry in entries]
        return sum(n[0] for n in seen) if all(seen) else None

    def _gradient_bytes(self, c: dict[str, np.ndarray]) -> None:
        """Put the run folder's dense gradient bytes on the gradient all-reduce of each step.

        A packed all-reduce's tensor is not traced. Candidates are all-reduces of unknown size outside
        any scope or in an optimizer's (a loss or metric is reduced under its own scope, e.g.
        ``div_no_nan/``), the scopes of control flow left out (Keras 3's ``LossScaleOptimizer`` applies the
        gradients in a ``cond``: ``cond/then/_416/cond/adam/CollectiveReduceV2``, which once went unsized while the
        gradients' bytes went on the loss's 4-byte reduce); an optimizer's goes first, then the one issued first in
        the step (the lowest instance key: ``apply_gradients`` creates it before a ``strategy.reduce`` of a metric
        after ``strategy.run``, which is unscoped too), then the shortest name, so every worker makes the same choice.
        Where no step all-gathers (no sparse gradient went out as rows), the Embedding tables' gradients were made
        dense before the exchange and ride in the same pack: their bytes are added.
        Where the collector read the traced step's sizes, only an all-reduce it found of no static shape is a candidate:
        a pack holding one gradient whose static shape TF's shape inference lost is ``[?]``: one row of 4 bytes and no
        lookups to count, so it went at 0 B (``bench/frameworks/tf_translator_fit.py``'s 854,848 B a step).
        """
        if not self.grad_bytes:
            return
        by_name: dict[str, tuple[bool, list[int]]] = {}  # node -> (in an optimizer's scope, its events)
        for i, coll in zip(self.collectives.event, self.collectives.kind):
            node = self.tab.names[c["name"][i]]
            scope = _CONTROL_FLOW.sub("", node).split("/")[:-1]
            dynamic = not self.sizes.nbytes or _BRANCH_CALL.sub(r"\1/", node) in self.sizes.row_bytes
            if coll == CommKind.ALL_REDUCE and c["nbytes"][i] == 0 and dynamic and (not scope or OPTIMIZER.match(scope[0])):
                by_name.setdefault(node, (bool(scope), []))[1].append(i)
        if by_name:
            first = min(int(c["step"][i]) for _, rows in by_name.values() for i in rows)
            issued = {n: min((int(c["seq"][i]) for i in rows if c["step"][i] == first), default=np.iinfo(np.int64).max)
                      for n, (_, rows) in by_name.items()}
            best = min(by_name, key=lambda n: (not by_name[n][0], issued[n], len(n), n))
            gathered = CommKind.ALL_GATHER in self.collectives.kind
            c["nbytes"][by_name[best][1]] = int(self.grad_bytes) + (0 if gathered else int(self.embedding_grad_bytes))

    def _refuse_looped(self, c: dict[str, np.ndarray]) -> None:
        """Refuse collectives that ran more than once a step under one instance key: a loop in the graph (Keras
        ``steps_per_execution`` > 1, a ``tf.range`` loop over ``strategy.run``) reuses the keys of its body's collectives
        in every iteration, so the workers' collectives cannot be matched one to one, nor their bytes told apart."""
        keyed = [i for i in self.collectives.event if c["seq"][i] >= 0 and c["step"][i] >= 0]
        seen = np.array([(c["group"][i], c["seq"][i], c["step"][i]) for i in keyed], dtype=np.int64).reshape(-1, 3)
        uniq, counts = np.unique(seen, axis=0, return_counts=True)
        if len(counts) and counts.max() > 1:
            g, key, step = uniq[int(np.argmax(counts))].tolist()
            node = self.tab.names[c["name"][next(i for i in keyed if c["seq"][i] == key and c["group"][i] == g)]]
            raise DagprofError(f"collective instance {key} of group {self.groups[g]} ({node}) ran {int(counts.max())} times in "
                               f"step {step}: collectives inside a loop of the graph (Keras "
                               "compile(steps_per_execution=N), a tf.range loop over strategy.run) reuse their keys each iteration "
                               "and are not modelled; profile with one training step per call (steps_per_execution=1)", self.path)

    def _xla_seq(self, c: dict[str, np.ndarray]) -> None:
        """Collectives without keys (XLA): numbered by step and position in the step, the same on every process."""
        todo = [i for i in self.collectives.event if c["seq"][i] < 0 and c["step"][i] >= 0]
        todo.sort(key=lambda i: (c["step"][i], c["start"][i]))
        pos: dict[int, int] = {}
        for i in todo:
            k = pos[int(c["step"][i])] = pos.get(int(c["step"][i]), -1) + 1
            c["seq"][i] = int(c["step"][i]) * _XLA_SEQ_PER_STEP + k


def _loop_bodies(c: dict[str, np.ndarray], main_lane: int) -> tuple[np.ndarray, np.ndarray, dict[int, list[int]]]:
    """(the depth-0 ops off the main thread, the loop ops among them, per loop op that ran in a step its body's ops
    ran after it in that step, outside it: their rows). An op's body is the ops nested in it on its thread in some
    step (by name: one parent op each); ``_split_loops`` and ``_async_loops`` bring such steps to one shape."""
    depth, lane, name, step, kind = c["depth"], c["lane"], c["name"], c["step"], c["kind"]
    start = c["start"]
    end = start + c["dur"]
    ops = np.flatnonzero((depth >= 0) & (lane != main_lane))
    top, inner = ops[depth[ops] == 0], ops[depth[ops] > 0]
    under: dict[int, set[int]] = {}  # nested op's name -> names of the ops it was nested in
    for ln in np.unique(lane[inner]).tolist():
        t = top[lane[top] == ln]
        t = t[np.argsort(start[t], kind="stable")]
        k = inner[lane[inner] == ln]
        at = np.searchsorted(start[t], start[k], side="right") - 1  # the top op it started in (tops do not overlap)
        ok = (at >= 0) & (kind[t[np.maximum(at, 0)]] != int(Kind.COMM_WAIT))  # not a client thread's wait for a run
        for child, parent in set(zip(name[k[ok]].tolist(), name[t[at[ok]]].tolist())):
            under.setdefault(child, set()).add(parent)
    parent_of = {child: next(iter(p)) for child, p in under.items() if len(p) == 1}
    outside = top[np.isin(name[top], list(parent_of)) & (step[top] >= 0)]
    loops = top[np.isin(name[top], list(set(parent_of.values())))]
    body: dict[int, list[int]] = {}  # loop op row -> its body's rows that ran after it
    for e in outside.tolist():
        own = loops[(name[loops] == parent_of[int(name[e])]) & (step[loops] == step[e]) & (end[loops] <= start[e] + _TICK_US)]
        if len(own):
            body.setdefault(int(own[np.argmax(end[own])]), []).append(e)
    return top, loops, body


def _usual(loops: np.ndarray, i: int, name: np.ndarray, step: np.ndarray, went_on: np.ndarray) -> bool:
    """Whether loop op ``i``'s body ran on after it in at least half the steps its op ran in (its usual way)."""
    twins = loops[(name[loops] == name[i]) & (step[loops] >= 0)]
    return 2 * int(np.isin(twins, went_on).sum()) >= len(twins)
