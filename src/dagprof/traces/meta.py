"""What a run and each of its ranks know beyond their events, typed: ``RunMeta`` and ``RankMeta``.

Readers fill them, ``align`` and ``graph`` read them; a field exists here once, so a misspelt
one is an error instead of a silent new key. Every field has a default (a reader sets what its
format knows); a framework's facts are one record each (``HorovodRecord``, ``PsRecord``,
``run_schema.FsdpInfo``, ``ClockAlignment``), absent (None) for runs of other frameworks.
They are msgspec Structs so the parse cache (``traces.cache``) stores ``RankMeta`` as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Container, Iterable, Literal, NamedTuple

import msgspec

from .comm_kind import CommKind
from .host_segments import HostSegments
from .run_schema import DdpApi, FsdpInfo, Manifest, ZeroInfo
from .window_cpu import WindowCpu


@dataclass(frozen=True)
class RankGap:
    """One rank of the job that the run lacks (``steps`` empty) or holds only in part (``traces.completeness``)."""

    rank: int
    why: str  # "no trace file", "stopped by SIGTERM during step 5 (no rank1.json)"
    steps_missing: tuple[int, ...] = ()  # of the requested window; empty: the whole rank is missing

    @property
    def missing_whole(self) -> bool:
        return not self.steps_missing


class CutStep(msgspec.Struct, frozen=True):
    """A trace's last step that its end cut inside (``traces.steps.cut_step``): the step and the ops that tell it, either
    its ops that end where the step's marker ends with nothing of the trace after them (``like`` -1), or its ops on the
    loop's thread, the first ``ops`` of the ``of`` that step ``like`` (and every step before it) ran there, or, where
    ``ended`` names an op, ``ops`` there none of which is that op, the one that every earlier step's there end on.
    ``idle``: its ops (``ops`` 0 all the same) held no backward or optimizer work where every earlier step held some."""

    step: int
    ops: int
    like: int = -1
    of: int = 0
    idle: bool = False
    ended: str = ""


@dataclass
class ClockAlignment:
    """The clock offsets ``align.clocks`` fitted on matched collective ends, and how well they agree."""

    offset_us: dict[int, float]  # rank -> add to that rank's absolute times
    residual_us: dict[str, float]  # spread of aligned collective ends: median, p90, max
    per_rank_residual_us: dict[int, float]  # median |aligned end - instance end| per rank
    instances_used: int
    outliers: int = 0
    reference_rank: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        r = self.residual_us
        return (f"{len(self.offset_us)} ranks aligned on {self.instances_used} collectives "
                f"({self.outliers} outliers dropped); residual skew median {r['median']:.1f} us, "
                f"p90 {r['p90']:.1f} us, max {r['max']:.1f} us")


class RunWarning(msgspec.Struct, frozen=True):
    """Something a reader noticed and worked around, shown to the user as ``str(w)``: ``what`` happened
    (``count`` of ``total`` events when counted), in ``file`` when it concerns one file."""

    what: str
    count: int = 0
    total: int = 0  # 0: not counted
    file: str = ""

    def __str__(self) -> str:
        text = f"{self.count} of {self.total} {self.what}" if self.total else self.what
        return f"{self.file}: {text}" if self.file else text


def warnings_of(texts: Iterable[str | RunWarning]) -> list[RunWarning]:
    """Entries for ``texts`` (plain strings: the collectors' files, align's notes), each once, in text order."""
    entries = (w if isinstance(w, RunWarning) else RunWarning(w) for w in texts)
    return [w for _, w in sorted({str(w): w for w in entries}.items())]


class Collectives(msgspec.Struct, kw_only=True):
    """Per transfer event (index into the rank's events): the collective its call ran (``kind``: what the user called,
    where the events' ``comm_kind`` says what crossed the wire: gloo's reduce-scatter an all-reduce) and dtype, which
    ``align`` checks across ranks; ``program``: the XLA program that ran it, ``in_loop``: whether a ``while`` of that
    program runs its instruction, once per iteration, ``origin``: the JAX primitive its instruction was lowered from
    (``all_to_all`` where the user wrote one; the op XLA partitioned where it resharded), ``devices``: its device groups
    as the program writes them (xplane only; empty where the program is not known; ``traces.xla_hlo``)."""

    event: list[int] = []
    kind: list[CommKind] = []
    dtype: list[str] = []
    program: list[int] = []
    in_loop: list[bool] = []
    origin: list[str] = []
    devices: list[str] = []

    def by_event(self) -> dict[int, CommKind]:
        """Event -> the collective its call ran."""
        return dict(zip(self.event, self.kind))


class AtResponse(NamedTuple):
    """A time at one of rank 0's Horovod responses (``HorovodRecord.peer_lags`` and ``peer_waits``), by its step and its
    position in the step."""

    step: int
    position: int
    us: float


class RowPull(NamedTuple):
    """A time of one row_sparse key's pull on a worker in a step (``PsRecord.row_pull_us``, ``PsLinkFit.row_pull_extra_us``)."""

    step: int
    worker: int
    key: int
    us: float


class HorovodRecord(msgspec.Struct, kw_only=True, frozen=True):
    """Horovod's settings and what its timeline showed (``traces.horovod``), kept for the what-ifs
    (``passes.horovod`` re-prices the graph's transfers from ``measured``)."""

    fusion_threshold_bytes: int | None = None
    cycle_time_ms: float | None = None
    cache_capacity: int | None = None
    autotune: bool | None = None
    tensor_order: list[str] = []  # tensors in the order their requests were first fused
    tensor_bytes: dict[str, int] = {}
    tensor_dtypes: dict[str, str] = {}  # as sent (``float16`` under fp16 compression); Horovod fuses one collective and dtype only
    cycles_marked: bool = False  # the timeline marks Horovod's cycles
    responses: int = 0
    timeline: str | None = None  # the timeline's file name in the run folder
    timeline_lag_us: float = 0.0  # how far its clock ran behind rank 0's (Timeline.shifted): moved by this much
    world_size: int = 0
    # rank 0's measurements per response: [step, position in step, fused bytes, transfer us, coordination us
    # (cycle start -> response start; -1: not its cycle's first)]
    measured: list[tuple[int, int, int, float, float]] = []
    # from every rank's own trace log (``traces.horovod_log``): per response, [step, position, us the last peer left it after
    # rank 0]; per negotiation that began a cycle, [step, position of its response, us of its span spent before the last
    # peer left the previous response, at most the median after responses of that size]: the wire in it, which
    # ``passes.comm`` scales with the link
    peer_lags: list[AtResponse] = []
    peer_waits: list[AtResponse] = []
    predicted: bool = False  # set by a what-if: fusion threshold and cycle time are the scenario's, not measured


class PsKey(msgspec.Struct, frozen=True):
    """One key a parameter-server job pushes and pulls."""

    key: int
    nbytes: int
    elements: int
    name: str
    layer: str
    # a row_sparse key (``gluon.contrib.nn.SparseEmbedding``): the bytes of one row on the wire, its values and its 8-byte
    # ps-lite key; it pushes and pulls only the rows a batch touched (``PsRecord.rows``). 0: a dense key, pushed whole
    row_bytes: int = 0
    table_rows: int = 0  # a row_sparse key's rows in all (its first dimension): ps-lite cuts a big one by row-id range


class ServerBusy(msgspec.Struct, frozen=True):
    """A server's time in one step (``traces.mxnet._server_busy``): receiving and summing pushes, running the optimizer."""

    file: int  # the server
    step: int
    busy_us: float  # all of it: the engine's ops, each key handed to the updater and the updater's Python
    updates: int  # the key parts it holds, one update each (ps-lite's placement)
    ops_us: float  # the engine's copies, sums, decompressions and ``*_update`` ops: the part that grows with the bytes
    # between its updates, the time its threads used no CPU: waiting for a push's bytes or a core (-1: its CPU not recorded)
    waited_us: float = -1.0


class PsRecord(msgspec.Struct, kw_only=True, frozen=True):
    """A parameter-server job (``traces.mxnet``): servers, keys and their placement, the servers' busy time;
    a graph's record (``graph.build_ps``) adds the measured exchanges."""

    framework: str = "mxnet"
    num_servers: int = 1
    num_workers: int = 1
    bigarray_bound: int = 1_000_000  # keys this big are split over every server
    placement: str = "ps-lite"
    keys: list[PsKey] = []
    server_busy: list[ServerBusy] = []
    servers_profiled: list[int] = []
    base_us: float = 0.0
    exchange_us: list[tuple[int, int, float]] = []  # (step, worker, first push issued -> last pull in), graphs only
    row_pull_us: list[RowPull] = []  # a row_sparse pull's call -> its rows in, graphs only
    cpu_us: list[tuple[int, int, float]] = []  # (step, worker, its process's CPU time in the step, all threads); [] before it was recorded
    # the same for the steps outside the profiled window: what the profiler added to the workers' CPU (passes.profiler_cost)
    unprofiled_cpu_us: list[tuple[int, int, float]] = []
    # (step, worker, its Python thread's CPU time in the step): MXNet's front end, which mx.profiler does not trace; [] before it was recorded
    main_cpu_us: list[tuple[int, int, float]] = []
    # (step, worker, key, rows per row-id range): the rows a row_sparse key pushed (and pulled: the batch's rows), counted in
    # ``row_ranges`` equal ranges of the table's row ids (``collect.hooks.mxnet_ps.ROW_RANGES``)
    rows: list[tuple[int, int, int, list[int]]] = []
    row_ranges: int = 840
    # the workers' gradient compression (``kv.set_gradient_compression``) as their traces record it: "2bit" where the pushes
    # are ``KVStoreDistCompressedPush`` (MXNet 1.x's only type): each dense push carries 16 elements a 4-byte word and the
    # pulls the full values (``traces.mxnet.pslite_bytes``); "": none
    compression: Literal["", "2bit"] = ""
    # the workers' pulls are ops of their own (``kv.push`` then ``kv.pull``; a compressed push), each issued once its push is
    # acknowledged (``graph.collectives.add_ps_part``'s ``engines``), not answers to a push-pull; graphs only
    pull_after_ack: bool = False


THREAD_NAME_CHARS = 15  # the kernel keeps a thread's name (``/proc/TID/comm``) to this many characters
# a thread whose name file did not read (``collect.hooks.thread_sched``), longer than any kernel name so that no thread has it
UNREAD_NAME = "(name unreadable)"
# a thread that still bears its process's own name (``python``: it never named itself, or its name was longer than the kernel
# keeps and did not set, as XLA's ``tf_XLAPjRtCpuClient`` pool's) is recorded apart as ``NAME#TID``: no pool joins such
# threads by name, so ``passes.comm_cpu.lane_threads`` tells a lane's among them by their CPU a step. The run file keeps
# the key as written; these two are the only code that knows its form.
_UNNAMED_SEP = "#"


def unnamed_thread_key(name: str, tid: int) -> str:
    """The per-name record's key of thread ``tid`` bearing its process's own ``name``."""
    return f"{name}{_UNNAMED_SEP}{tid}"


def is_unnamed_thread(key: str) -> bool:
    """Whether a per-name record's key is one thread bearing its process's name (``unnamed_thread_key``), not a name."""
    return _UNNAMED_SEP in key


class OtherThreads(msgspec.Struct, frozen=True):
    """A step of a process's threads other than the training thread, summed (gloo's, Kineto's, a pool's): their CPU, their
    waits for a core and the times they got one (``collect.hooks.thread_sched``). Their wait over their runs is what one
    wake-up of them waited for a core (``passes.comm_cpu``)."""

    cpu_us: float
    wait_us: float
    runs: int


class StepSched(msgspec.Struct, frozen=True):
    """One step of the thread that marked the steps (the training thread): its CPU time and the time it was runnable but
    waited for a core (the kernel's schedstat, ``collect.hooks.thread_sched``), and its process's CPU time, every thread's."""

    step: int
    cpu_us: float
    wait_us: float
    process_cpu_us: float | None = None  # None: not recorded (older files)
    runs: int | None = None  # times the thread got a core in the step (None: not recorded, older files)
    others: OtherThreads | None = None  # the process's other threads in the step (None: not recorded, older files)
    # the same per thread name (``/proc``'s comm, ``THREAD_NAME_CHARS``; TF's ``tf_Compute``...; ``UNREAD_NAME``: threads whose
    # name did not read): None where not recorded (older files, torch ranks); a name absent in a step: its threads neither ran
    # nor waited in it
    named: dict[str, OtherThreads] | None = None

    @property
    def off_thread_cpu_us(self) -> float | None:
        """The process's CPU less the training thread's: every other thread's (gloo's, Kineto's, a pool's), read from the
        process's clock, so threads born or ended within the step count too (``others`` sums the threads it watched);
        None where the process's CPU was not recorded."""
        return None if self.process_cpu_us is None else self.process_cpu_us - self.cpu_us


def step_scheds(thread_sched_ns: list[tuple[int, int, int]], process_cpu_ns: list[tuple[int, int]],
                thread_runs: list[tuple[int, int]], other_threads_ns: Iterable[tuple[int, int, int, int]] = (),
                named_threads_ns: dict[str, list[tuple[int, int, int, int]]] | None = None) -> list[StepSched]:
    """A rank file's per-step schedstat records (``collect.hooks.thread_sched``: (step, thread CPU ns, run-queue wait
    ns), (step, process CPU ns), (step, times the thread got a core), (step, the other threads' CPU ns, wait ns, runs),
    name -> the same per thread name) as ``StepSched``s, us."""
    process, runs = dict(process_cpu_ns), dict(thread_runs)
    others = {s: OtherThreads(c / 1e3, w / 1e3, n) for s, c, w, n in other_threads_ns}
    named: dict[int, dict[str, OtherThreads]] = {}
    for name, rows in (named_threads_ns or {}).items():
        for s, c, w, n in rows:
            named.setdefault(s, {})[name] = OtherThreads(c / 1e3, w / 1e3, n)
    return [StepSched(s, c / 1e3, w / 1e3, None if s not in process else process[s] / 1e3, runs.get(s), others.get(s),
                      None if named_threads_ns is None or s not in others else named.get(s, {}))
            for s, c, w in thread_sched_ns]


def split_at_window(sched: list[StepSched], profiled: Container[int]) -> tuple[list[StepSched], list[StepSched]]:
    """``sched``'s records of the ``profiled`` steps and of the others (``RankMeta.train_thread``,
    ``unprofiled_train_thread``), as both rank readers keep them apart."""
    return [x for x in sched if x.step in profiled], [x for x in sched if x.step not in profiled]


def runnable_stretch(steps: list[StepSched]) -> float:
    """The thread's CPU plus its waits for a core over its CPU, summed over ``steps``: how much longer CPU work took on
    the job's loaded cores than on a core of its own; 0 where nothing was recorded."""
    cpu = sum(s.cpu_us for s in steps)
    return (cpu + sum(s.wait_us for s in steps)) / cpu if cpu > 0 else 0.0


class GradClip(msgspec.Struct, frozen=True):
    """A step's ``torch.nn.utils.clip_grad_norm_`` calls as dagprof's collector saw them (``Rec.GRAD_CLIP``)."""

    calls: int
    tensors: int  # gradients they clipped, all calls together
    us: float  # their time together


class OptimizerOps(msgspec.Struct, kw_only=True, frozen=True):
    """What Kineto shows inside one FSDP2 rank's optimizer steps in the window (``traces.fsdp_run.optimizer_ops``): the
    steps' time, and of it the ops DTensor's dispatch ran on the local shards (the part that works on the shard's bytes);
    the rest (the dispatches around them, the Python between them, plain tensors' ops) is per tensor."""

    steps: int  # optimizer steps timed
    us: float  # their time together
    local_us: float  # of it, under DTensor's dispatches (``PythonSubclass``): the ops on the local shards
    dispatches: int  # DTensor dispatches in them (0: no DTensor op seen, so nothing splits the step)


class UnseenCollective(msgspec.Struct, frozen=True):
    """A kind of collective a dagprof run's Kineto trace shows inside other ops (an expert all-to-all, a pipeline send,
    SyncBatchNorm's all-reduce), no hook saw: how many in the window, and their transfers' time on the comm threads."""

    count: int = 0
    us: float = 0.0  # Kineto's spans, summed
    nbytes: int = 0  # the bytes the collector recorded for their calls (``CommKind.event_bytes``), summed
    sized: int = 0  # how many of them it recorded (the others: no bytes known)


class InOpGroup(msgspec.Struct, frozen=True):
    """A dagprof run's collectives that Kineto shows outside every hooked call (inside the model's ops, or the job's own host
    time), of one process group, labelled with its mesh dimension (``traces.parallelism.in_op_groups``): how many in the
    window on this rank, and their transfers' time on the comm threads. The graph times them inside those ops."""

    group: str  # its ranks, "0,1" ("": not told)
    dim: str  # ``Dim.text``
    count: int = 0
    us: float = 0.0  # Kineto's spans, summed
    nbytes: int = 0  # the bytes the collector recorded for their calls (``CommKind.event_bytes``), summed
    sized: int = 0  # how many of them it recorded (the others: no bytes known)


class HookWire(msgspec.Struct, frozen=True, kw_only=True):
    """What a DDP comm hook of the job's own put on the wire in a dagprof run's window (``traces.run_comm.hook_calls``):
    its bucket transfers are priced from it, and what it cannot say is refused (``passes.buckets.refuse_own_ddp_setup``)."""

    calls: int  # the hook's calls for a bucket
    unpriced: int  # of them, calls whose wire is no one kind's collectives in DDP's group (none recorded, several kinds)
    kinds: list[str]  # the kinds of the collectives its calls issued for later (labels)
    most: int  # most collectives one call issued for later: each call is priced as one transfer of their bytes
    issued_bytes: int  # bytes per rank of every collective its calls issued for later
    blocking: int  # collectives it blocked on inside its calls (their time is in the calls' spans, as measured)
    blocking_bytes: int  # their bytes per rank
    late: int  # collectives its futures' callbacks called after its calls: no bucket's
    wire: dict[int, int]  # bucket -> its transfer's bytes, where all its calls put the same on the wire
    varying: bool  # a bucket's calls put other bytes on the wire from call to call, or from rank to rank (its data decides)

    def merged(self, other: HookWire | None) -> HookWire:
        """Rank 0's wire, with the worst of both ranks' refusal facts (a rank's late callbacks, unpriced calls or
        blocking bytes refuse for the job), varying where another rank's wire differs (or it recorded none)."""
        if other is None:
            return msgspec.structs.replace(self, varying=True)
        worse = max(self, other, key=lambda w: w.blocking_bytes / max(w.issued_bytes + w.blocking_bytes, 1))
        return msgspec.structs.replace(
            self, unpriced=max(self.unpriced, other.unpriced), kinds=sorted({*self.kinds, *other.kinds}), most=max(self.most, other.most),
            blocking=max(self.blocking, other.blocking), blocking_bytes=worse.blocking_bytes, issued_bytes=worse.issued_bytes,
            late=max(self.late, other.late), varying=self.varying or other.varying or other.wire != self.wire)


class RankMeta(msgspec.Struct, kw_only=True):
    """One rank's facts beyond its events; which fields a reader fills depends on its format."""

    format: str = ""  # kineto | xplane | dagprof-rank (the reader's name for what it read)
    framework: str = ""  # tensorflow, jax, mxnet as the reader names it; "": PyTorch
    framework_version: str = ""
    warnings: list[RunWarning] = []
    # --- collectives: naming, matching and grouping (kineto, xplane, dagprof runs, horovod)
    rank_source: str = ""  # where the rank number came from (kineto: distributedInfo, the file name, assumed)
    schema: int | str | None = None  # the Kineto trace's schemaVersion
    collectives: Collectives | None = None
    explicit_seq: bool = False  # the trace numbers each collective within its group (else: by order)
    declined: dict[str, int] = {}  # per Dep rule, the inferred dependencies the measured timeline contradicted
    group_desc: dict[str, str] = {}  # process-group descriptions (pg_config): "mesh_tp", "default_pg"
    resolved_groups: list[str] = []  # groups ``traces.parallelism.resolve_groups`` moved collectives to
    # dagprof runs: the Kineto trace's collectives in the window that no hook saw, issued inside other ops, by
    # kind; timed inside those ops, not as collectives
    unseen_collectives: dict[CommKind, UnseenCollective] = {}
    in_op_groups: list[InOpGroup] = []  # those collectives (FSDP's run: those outside its calls) by group and mesh dimension
    # --- set by align
    step_offset: int = 0  # added to this rank's step numbers to match the others' (align.matching)
    clock_offset_us: float = 0.0  # added to this rank's clock (align.clocks)
    # --- the training loop (dagprof's collectors; steps_profiled and step_times_us from xplane runs too)
    steps_profiled: list[int] = []
    cut_step: CutStep | None = None  # Kineto: the last step, when the trace's end cut inside it (``traces.steps.cut_step``)
    step_times_us: dict[int, float] = {}  # profiled step -> us
    train_thread: list[StepSched] = []  # dagprof runs: per profiled step, the training thread's CPU and waits for a core ([]: not recorded)
    unprofiled_train_thread: list[StepSched] = []  # the same of the steps outside the window ([]: not recorded, older files)
    grad_clips: dict[int, GradClip] = {}  # dagprof runs: profiled step -> its clip_grad_norm_ calls ({}: none, or an older file)
    unprofiled_step_times_us: dict[int, float] | None = None  # None: the reader has no loop timing (not a dagprof run)
    window_tx_bytes_per_step: float | None = None  # bytes the host's interfaces sent per profiled step (TF/JAX/Horovod windows; None: not counted)
    window_cpu: WindowCpu | None = None  # TF/JAX: the window's wall, its cores' busy and its process's CPU time (None: not recorded)
    # TF: a sparse gradient's all-gather in either branch (event) -> [this worker's rows, bytes a row]; the branch that pads
    # unequal row counts sends the most rows any worker has, which the run's reader sets (``xplane_run.size_padded_gathers``)
    padded_rows: dict[int, list[int]] = {}
    host_segments: HostSegments | None = None  # TF/JAX: the main thread's time as its host ranges label it (None: not read)
    xla_compiles: list[tuple[float, float]] = []  # TF/JAX: when XLA compiled (start, end), on the rank's clock, us, any thread's
    collective_operands_per_step: float | None = None  # XLA (JAX): arrays its collectives carried a step, one gloo call each (None: unknown)
    pid: int | None = None
    cpus: int = 0  # dagprof, MXNet and TF/JAX runs: cores the rank could run on (0: not recorded)
    cpu_set: str = ""  # which, as a cpu list (``traces.cpu_sets``; "": not recorded): ranks pinned apart share none
    scheduler_tick_us: float | None = None  # TF/JAX runs: its host kernel's tick, 1 / CONFIG_HZ (None: not recorded)
    torch: str = ""
    mode: str = ""  # api (dagprof.profile) | launcher (dagprof profile -- ...)
    bucket_cap_mb: float | None = None
    ddp_models: int = 0  # DDP models the job wrapped (0: not recorded)
    ddp_api: DdpApi = ""  # "replicate": its DDP is the composable replicate()'s (RankFile.ddp_api); "": DistributedDataParallel
    comm_hook: str = ""  # the job's own DDP comm hook, by name ("": DDP's all-reduce, or not recorded)
    hook_wire: HookWire | None = None  # what that hook put on the wire (None: DDP's or torch's hooks, or not recorded)
    find_unused: bool = False  # a DDP model with find_unused_parameters=True, no static graph (RankFile.find_unused)
    steps_requested: list[int] = []  # [first, stop)
    steps_completed: int = 0
    comm_lanes: list[str] = []
    layer_grad_bytes: dict[str, int] = {}  # module path -> bytes of its parameters' gradients
    layer_frozen_bytes: dict[str, int] = {}  # module path -> bytes of its parameters that take none (RankFile.layer_frozen_bytes)
    layer_saved_bytes: dict[str, int] = {}  # module path -> activation bytes it saved for backward
    layer_output_bytes: dict[str, int] = {}  # module path -> bytes its forward returned (RankFile.layer_output_bytes; {}: not recorded)
    layer_types: dict[str, str] = {}  # a numbered module path -> its class (RankFile.layer_types)
    layer_autograd_nodes: dict[str, int] = {}  # module path -> autograd nodes its forward made (RankFile.layer_autograd_nodes; {}: not recorded)
    comm_source: str = ""  # where the collectives' timing came from (Kineto, the comm hooks)
    kineto: str | None = None  # the rank's Kineto trace, when it gave the communication
    fsdp: FsdpInfo | None = None  # an FSDP2 job's units and collectives
    optimizer_ops: OptimizerOps | None = None  # an FSDP2 job with Kineto: its optimizer steps' ops (None: no Kineto)
    zero: ZeroInfo | None = None  # a ZeroRedundancyOptimizer's shards and broadcasts (collect.hooks.zero)
    horovod_clock_shift_ns: int = 0  # traces.horovod: shift of the timeline's clock onto this rank's


def tx_bytes_per_step(window_tx_bytes: int | None, steps_profiled: list[int]) -> float | None:
    """``RankMeta.window_tx_bytes_per_step`` from a rank file's count over its window: one rule for every reader
    that has the count (TF/JAX, Horovod); None where it was not counted or no step was profiled."""
    return None if window_tx_bytes is None or not steps_profiled else window_tx_bytes / len(steps_profiled)


class PaddedGather(msgspec.Struct, frozen=True):
    """TF: one all-gather of a sparse gradient over the profiled steps, either branch (equal row counts, or padded to the
    most any worker has): on more workers every worker sends the most rows any has, so the profiled workers' own counts
    (not their most alone) are what prices it on other worker counts (``passes.padded_gathers``)."""

    row_bytes: int  # bytes of one gathered row (CollectiveSizes.row_bytes)
    rows: dict[int, list[int]]  # profiled step -> each worker's own rows that step, in rank order


class RunMeta(msgspec.Struct, kw_only=True):
    """The job's facts beyond its ranks: what is missing, what was warned, the framework's record."""

    warnings: list[RunWarning] = []
    framework: str = ""  # as RankMeta.framework: "" is PyTorch
    rank_gaps: list[RankGap] = []  # what readers know is missing (traces.completeness)
    missing_ranks: list[int] = []
    skipped: dict[str, str] = {}  # file -> why it is not a rank of the run (kineto_dir)
    partial: bool = False  # the user chose to analyse a run with ranks or steps missing
    manifest: Manifest | None = None  # a dagprof run folder's manifest
    ddp: bool = False  # dagprof runs: DDP gradient buckets were seen
    fsdp: bool = False  # dagprof runs: every rank recorded FSDP2 units
    horovod: HorovodRecord | None = None
    ps: PsRecord | None = None  # a parameter-server job (the "parameter server" RunKind)
    clocks_done: bool = False  # align.one_clock tried (clock_alignment None: it could not)
    clock_alignment: ClockAlignment | None = None
    parallelism_notes: list[str] = []
    # TF: a padded all-gather, by its name less the branch call and instance (``xplane_run.padded_key``) -> the workers' counts
    padded_gathers: dict[str, PaddedGather] = {}

    def warned(self, *notes: str | RunWarning) -> RunMeta:
        """A copy with ``notes`` appended to the warnings (runs are not edited in place)."""
        return msgspec.structs.replace(self, warnings=[*self.warnings, *(n if isinstance(n, RunWarning) else RunWarning(n) for n in notes)])

    def warning_texts(self) -> list[str]:
        """The warnings as the user reads them."""
        return [str(w) for w in self.warnings]

