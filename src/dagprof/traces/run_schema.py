"""The dagprof run-folder format as types: what ``collect`` writes and ``dagprof_run`` reads.

A run folder holds ``manifest.json`` (job-wide, a ``Manifest``), per rank ``rank<R>.json``
(a ``RankFile``: hook records, bucket layouts, step times, clock, host facts) and optionally
``rank<R>.kineto.json.gz`` (the torch.profiler trace of the same window). The collector builds
these Structs and encodes them; the reader decodes into them, so a field exists in one place.

A rank that dies inside its window loses nothing it completed: while the window runs, every
completed step is also written to ``rank<R>.steps/`` (``steps_dir``): ``head.json`` (a ``RankFile``
without records, written atomically at the window's start), ``steps.jsonl`` (append-only: one
line per completed step, a ``StepPart``; the newline that ends a line commits it, so a line cut
off by a kill is recognised and dropped) and, when a signal stops the process, ``ended.json``
(an ``Ended``). The folder is removed once ``rank<R>.json`` is written; the reader rebuilds the
rank from it when ``rank<R>.json`` is missing, and names what is lost. One append per step costs
about a twentieth of an atomic file per step (``bench/bench_step_flush.py``).

Versioning. Every file carries ``format`` and ``version``. A reader accepts ``MIN_VERSION`` ..
``VERSION`` and refuses anything else in one line (a newer file: upgrade dagprof; an older one
it cannot read: profile again). Adding a field WITH a default keeps the version: older readers
skip fields they do not know, newer ones fill the default. Removing, renaming or changing the
meaning of a field bumps ``VERSION``; ``tests/data/run_schema/v<N>/`` keeps a real folder of each
version, and the test reads every one of them (or sees it refused in one line) with the current
reader. No torch here: the core imports this module.
"""
from __future__ import annotations

import enum
import os
import re
from typing import Annotated, Literal

import msgspec

from ..errors import DagprofError
from ..fsutil import decode_versioned, read_input, read_versioned
from . import cpu_sets
from .buckets import BucketLayout
from .comm_kind import CommKind

Count = Annotated[int, msgspec.Meta(ge=0)]  # a size or count in a rank file: negative is damage, refused by the decoder
CpuList = Annotated[str, msgspec.Meta(pattern=cpu_sets.PATTERN)]  # a rank's affinity set, ``0-3,8`` (``traces.cpu_sets``; "": not recorded)

FORMAT = "dagprof-run"
RANK_FORMAT = "dagprof-rank"
STEP_FORMAT = "dagprof-step"
ENDED_FORMAT = "dagprof-ended"
VERSION = 1
MIN_VERSION = 1
MANIFEST = "manifest.json"
REPLICATE_API = "replicate"  # RankFile.ddp_api of a job whose DDP the composable torch.distributed._composable.replicate() built

DdpApi = Literal["", "replicate"]  # which API built a run's DDP: REPLICATE_API, or "" (DistributedDataParallel, or an older file)


def ddp_label(api: str) -> str:
    """How outputs and refusals name a job's DDP (``RankFile.ddp_api``): the composable ``replicate()`` runs DDP's reducer,
    named as the user wrote it."""
    return "replicate() (DDP)" if api == REPLICATE_API else "DDP"


def rank_file(rank: int) -> str:
    return f"rank{rank}.json"


_RANK_NAMED = re.compile(r"rank(\d+)\.(?:json|kineto\.json\.gz|horovod\.json|steps)")


def refuse_ranks_beyond(folder: str, world: int) -> None:
    """A file named for a rank the manifest's job lacks is a copy or another run's: the folder is not one run (its
    rank files alone would be read and the rest ignored unseen)."""
    extra = sorted((int(m.group(1)), n) for n in os.listdir(folder) if (m := _RANK_NAMED.fullmatch(n)) and int(m.group(1)) >= world)
    if extra:
        raise DagprofError(f"named for rank {extra[0][0]}, but {MANIFEST} says {world} ranks: a copy or another run's file "
                           f"({len(extra)} such here); remove it, or give this run a folder of its own", os.path.join(folder, extra[0][1]))


def kineto_file(rank: int) -> str:
    return f"rank{rank}.kineto.json.gz"


def steps_dir(rank: int) -> str:
    return f"rank{rank}.steps"


STEPS_HEAD = "head.json"
STEPS_LOG = "steps.jsonl"
STEPS_ENDED = "ended.json"

# ``RankFile.layer_saved_bytes`` keys that name no layer (in <...>, which no module path has)
SAVED_OUTSIDE_LAYERS = "<outside leaf modules>"  # activations saved by the loss and functional ops
MODEL_OUTPUT = "<model output>"  # what the model's forward returned (a script that keeps the logits holds them)
LOSS_BACKWARD = "<loss backward>"  # the most bytes the loss's graph held in its backward (``collect.hooks.loss_graph``)
LOSS_FORWARD = "<loss forward>"  # what the loss's graph saved, as its backward starts (``collect.hooks.loss_graph``)
# ``RankFile.layer_autograd_nodes``' key for the nodes of the step before still held as a forward begins: the script keeps its
# loss (a loop variable) until it assigns the next one, and that loss holds its graph's shells
PREVIOUS_GRAPH = "<previous graph>"


class Rec(enum.IntEnum):
    """Record codes; ``a``/``b``/``x`` meaning per code."""

    STEP_BEGIN = 0  # a=step
    STEP_END = 1  # a=step
    FWD_BEGIN = 2  # a=layer, b=call index of that layer in the step, x=1 under torch.no_grad (0: autograd on, or not recorded)
    FWD_END = 3  # a=layer, b=call
    BWD_BEGIN = 4  # a=layer, b=call: gradient w.r.t. an output arrived
    BWD_END = 5  # a=layer, b=call: gradient w.r.t. an input computed
    GRAD_READY = 6  # a=layer: a parameter's gradient was accumulated
    ENQ_BEGIN = 7  # a=bucket, b=seq, x=1 for a sparse gradient (gloo all-gathers it): comm hook entered
    ENQ_END = 8  # a=bucket, b=seq, x=bytes on the wire (a sparse gradient's: every rank's gathered): all-reduce issued
    COMM_DONE = 9  # a=bucket, b=seq, x=native thread id that completed it
    UPDATE_BEGIN = 10  # optimizer.step entered
    UPDATE_END = 11
    WAIT_BEGIN = 12  # autograd's end-of-backward callbacks start (DDP waits for buckets)
    WAIT_END = 13  # DDP's finalize done
    DATA_BEGIN = 14  # a DataLoader iterator's __next__ entered
    DATA_END = 15
    FSDP_COLL_BEGIN = 16  # a=index into RankFile.fsdp.collectives, b=unit: FSDP called the collective
    FSDP_COLL_END = 17  # a=index, b=unit: the call returned (gloo on CPU: the transfer is done)
    FSDP_COPY_OUT_BEGIN = 18  # a=unit, b=0 forward / 1 backward: copying the all-gather output into the parameters
    FSDP_COPY_OUT_END = 19
    FSDP_RESHARD_BEGIN = 20  # a=unit, b=0 after forward / 1 after backward: gathered parameters freed
    FSDP_RESHARD_END = 21
    ZERO_STEP_BEGIN = 22  # a=DDP bucket: ZeRO's overlapped local step on this rank's shard of it (inside DDP's comm hook)
    ZERO_STEP_END = 23  # a=bucket
    ZERO_BCAST_BEGIN = 24  # a=bucket, b=seq (the comm hook's numbering), x=owner rank: ZeRO's broadcast of the bucket's parameters called
    ZERO_BCAST_END = 25  # a=bucket, b=seq, x=bytes: issued (its COMM_DONE, b=seq, completes it)
    ZERO_WAIT_BEGIN = 26  # ZeRO's overlapped step waits for all its broadcasts (inside the last bucket's hook)
    ZERO_WAIT_END = 27
    OWN_COLL = 28  # a=kind (index into OWN_KINDS), b=group size, x=bytes per rank: the model called a blocking collective itself
    OWN_ASYNC = 29  # a=kind, b=group size, x=bytes per rank: the model issued a collective it waits for later (async_op, functional)
    OWN_WAIT = 30  # a=kind, x=its OWN_ASYNC's time: the model's first wait for that collective began
    GRAD_CLIP = 31  # a=gradient tensors, x=ns the call took: torch.nn.utils.clip_grad_norm_ entered (collect.hooks.grad_clip)
    # a DDP comm hook of the job's own called a collective inside its call for a bucket (``collect.hooks.own_collectives``):
    # a=kind (index into OWN_KINDS), b=the bucket call's seq (its ENQ_BEGIN's), x=bytes per rank
    HOOK_COLL = 32  # issued for later (async_op=True): on the wire between the hook's call and its future's completion
    HOOK_BLOCKING = 33  # blocking: its transfer is inside the hook's call (the bucket's enqueue span)
    HOOK_LATE = 34  # a=kind, x=bytes per rank (-1: a kind not sized): called after its call by a callback that hook chained
    # on a future (PowerSGD's later all-reduces), which no bucket call's records hold


# The collectives a model calls itself that the collector sizes (``collect.hooks.own_collectives``); a record names one by
# its position here
OWN_KINDS = (CommKind.ALL_GATHER, CommKind.ALL_REDUCE, CommKind.SCATTER, CommKind.GATHER, CommKind.BROADCAST, CommKind.ALL_TO_ALL)


class Col(enum.IntEnum):
    """Columns of a record ``[code, a, b, t_ns, x]`` (a row of ``RankFile.records``)."""

    CODE = 0  # a ``Rec``
    A = 1
    B = 2
    T_NS = 3  # time.time_ns() when the hook ran (Kineto's clock too)
    X = 4


class Clock(msgspec.Struct):
    """Both clocks read at the same moment when the file was written."""

    unix_ns: int
    perf_ns: int


class FsdpUnit(msgspec.Struct, kw_only=True):
    """One FSDP unit: FSDP2's ``FSDPParamGroup`` (the parameters one ``fully_shard`` call manages) or
    FSDP1's ``FullyShardedDataParallel`` instance (its flat parameter)."""

    name: str  # module path (FSDP_ROOT for the root module)
    layers: list[int] = []  # leaf layers (indexes into RankFile.layers) it runs, not those of nested units
    params: list[str] = []
    numel: int = 0  # unsharded parameter elements
    shard_bytes: int = 0  # this rank's parameter shard
    orig_dtype: str = ""
    param_dtype: str = ""  # what the all-gather moves (mixed precision)
    reduce_dtype: str = ""  # what the reduce-scatter moves
    reshard_after_forward: bool = True
    # FSDP2's ``reshard_after_forward=N`` (an int below the shard degree): after forward the unit keeps a shard over N
    # ranks (its ``post_forward_mesh_info``), and its backward all-gather runs in that N-rank group; 0: its own shard group
    reshard_to: Count = 0
    offload: bool = False  # FSDP2's ``CPUOffloadPolicy``: its shards, their gradients and optimizer state live in host memory
    mesh: list[int] = []  # device mesh shape: (shard,) or HSDP's (replicate, shard)
    mesh_dims: list[str] = []
    # of numel, the elements (and of params, the tensors) that take no gradient: FSDP gathers them but reduce-scatters,
    # and the optimizer steps, only the others (0: none, or an older file)
    frozen_numel: Count = 0
    frozen_tensors: Count = 0
    # FSDP1 only (empty for FSDP2, whose prefetch is per unit and recorded on each collective)
    strategy: str = ""  # ShardingStrategy: FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD | HYBRID_SHARD_ZERO2
    backward_prefetch: str = ""  # BackwardPrefetch: BACKWARD_PRE | BACKWARD_POST ("": none)
    forward_prefetch: bool = False
    # the class of the ``fully_shard`` root a unit belongs to when that root is not the profiled model (a second root, a DINO
    # student beside the teacher dagprof attached to first): its collectives are recorded, its layers are not timed (``layers``
    # empty), so its compute is host time between timed layers. "": the profiled model's unit (or an older file)
    untimed_root: str = ""
    # which attached root the unit belongs to (``collect.hooks.collector.root_of``): 0 the first, k > 0 another ``fully_shard``
    # root timed beside it (its unit names prefixed as its layers are, its root unit named by that prefix)
    root: Count = 0


class FsdpCollective(msgspec.Struct, kw_only=True):
    """One collective FSDP issued in the window, or the job's: a ``DTensor.full_tensor()`` gather (phase ``FULL_TENSOR``: a
    state_dict gathered for a save) or a blocking c10d call of its own (phase ``JOB_CALL``: DCP's object collectives), unit
    -1; ``Rec.FSDP_COLL_*`` records time it."""

    kind: str  # all_gather | reduce_scatter | all_reduce (HSDP, across replicas); JOB_CALL: also gather | scatter | broadcast | barrier
    unit: int  # index into FsdpInfo.units; -1 for the job's (JOB_PHASES)
    phase: str  # forward | backward | FULL_TENSOR | JOB_CALL
    prefetched_by: int  # the unit whose hook issued it ahead of time; -1: the unit itself, when it needed it
    nbytes: int  # all-gather: gathered bytes; reduce-scatter / all-reduce: bytes reduced
    dtype: str
    group: str  # the ranks of its process group, "0,1"
    issued_ns: int


FULL_TENSOR = "full_tensor"  # FsdpCollective.phase of the job's own DTensor.full_tensor() gathers (collect.hooks.fsdp)
JOB_CALL = "job"  # FsdpCollective.phase of the job's own blocking c10d calls outside FSDP's (DCP's saves: collect.hooks.fsdp.JOB_CALLS)
JOB_PHASES = (FULL_TENSOR, JOB_CALL)  # the job's collectives, of no unit (FsdpCollective.unit -1)
FSDP2_API, FSDP1_API = "fully_shard", "FullyShardedDataParallel"  # FsdpInfo.api: which FSDP wrapped the units
FSDP_ROOT = "<root>"  # FsdpUnit.name of the root module's unit (FSDP names it "")


class ZeroInfo(msgspec.Struct, kw_only=True, frozen=True):
    """A ``ZeroRedundancyOptimizer`` (ZeRO-1, ``collect.hooks.zero``): each rank steps the optimizer state of the
    parameters it owns, then every owner broadcasts them; ``owners`` and ``nbytes`` are those broadcasts in the order
    ``step()`` issues them (by owner rank, then parameter; one per owner with ``parameters_as_bucket_view``)."""

    optimizer: str  # the local optimizer's class (AdamW)
    world_size: int  # ranks the state is sharded over (the optimizer's process group)
    owners: list[int] = []
    nbytes: list[Count] = []
    owned_bytes: Count = 0  # this rank's shard, bytes of parameters it steps
    # overlap_with_ddp (``hook_with_zero_step``): the DDP bucket of each broadcast (each bucket has one owner, who steps it
    # inside the last bucket's comm hook once its all-reduce is done, then broadcasts it); empty: the step after backward
    buckets: list[int] = []


class FsdpInfo(msgspec.Struct, kw_only=True):
    """What FSDP did on this rank in the window (``collect.hooks.fsdp``, FSDP1: ``collect.hooks.fsdp1``)."""

    api: str = FSDP2_API
    units: list[FsdpUnit] = []
    collectives: list[FsdpCollective] = []
    param_shard_bytes: int = 0  # sharded parameters, gradients and optimizer state on this rank at the window's end
    grad_shard_bytes: int = 0
    optim_state_bytes: int = 0
    # module path -> bytes of the gathered parameters among what it saved for backward (their storages, padded to the shard
    # count), the most in one profiled step; None: not recorded (FSDP1, older files: ``search.fsdp_memory.fsdp_peak``'s threshold)
    layer_saved_gathered_bytes: dict[str, Count] | None = None
    # module path -> bytes its forward returned (a leaf module's), the most in one profiled step: the gradient reaching it in
    # backward is as large (``search.fsdp_memory.fsdp_peak`` counts it in flight); None: not recorded (older files)
    layer_output_bytes: dict[str, Count] | None = None
    # module path -> bytes its forward received (a leaf module's tensor arguments, each storage once), the most in one
    # profiled step: what a layer inside activation checkpointing saves when its forward runs again in backward, which no
    # saved-tensor hook sees (``search.fsdp_memory._Job.recomputed``); None: not recorded (older files)
    layer_input_bytes: dict[str, Count] | None = None
    # unit name -> bytes saved for backward between leaf modules (functional ops: a block's ``F.relu``) while its forward ran,
    # not an inner unit's, the most in one profiled step (part of ``SAVED_OUTSIDE_LAYERS``, freed at the unit's backward);
    # None: not recorded (older files: ``search.fsdp_memory.fsdp_peak`` keeps them all to the step's end)
    unit_saved_outside_bytes: dict[str, Count] | None = None


class Manifest(msgspec.Struct, kw_only=True):
    """``manifest.json``: written by rank 0 when the window starts (by any rank if it is missing)."""

    format: str = FORMAT
    version: int = VERSION
    world_size: int
    steps_requested: tuple[int, int]  # [first, stop)
    backend: str = ""
    kineto: bool = True
    record_shapes: bool = False
    mode: str = "api"  # api (dagprof.profile) | launcher (dagprof profile -- ...)
    argv: list[str] = []
    created_ns: int = 0


class RankFile(msgspec.Struct, kw_only=True):
    """``rank<R>.json``: one process's window, written when the window ends (again at exit)."""

    format: str = RANK_FORMAT  # first: `dagprof profile` recognises its own files by their first bytes
    version: int = VERSION
    rank: int
    world_size: int
    local_rank: int = 0
    backend: str = ""
    host: str = ""
    cpus: int = 0  # cores this process could run on (0: not recorded); ranks past them share the host's cores
    cpu_set: CpuList = ""  # which: pinned ranks on one host may each run on cores of their own ("": files before 2026-12-06)
    pid: int = 0
    torch: str = ""
    mode: str = "api"
    ddp: bool = False
    bucket_cap_mb: float | None = None
    ddp_models: int = 0  # DDP models the job wrapped (a GAN's two); 0: not recorded (older files)
    ddp_api: DdpApi = ""  # REPLICATE_API: the DDP is the composable replicate()'s; "": DistributedDataParallel (or an older file)
    comm_hook: str = ""  # the job's own DDP comm hook, by name ("": DDP's all-reduce, or not recorded)
    # a DDP model with find_unused_parameters=True and no static graph: its reducer all-reduces which parameters got a
    # gradient, inside backward, and never rebuilds its buckets
    find_unused: bool = False
    steps_requested: tuple[int, int]  # [first, stop)
    steps_profiled: list[int]
    steps_completed: int = 0
    final: bool = False  # written at exit rather than at the window's end
    ended: str = ""  # what stopped it inside the window: "stopped by SIGTERM during step 5", "ended by RuntimeError (...) during step 5"
    kineto_file: str | None = None  # relative to the run folder
    record_shapes: bool = False
    clock: Clock | None = None
    warnings: list[str] = []
    layers: list[str]  # leaf module paths; records name layers by index into this
    layer_grad_bytes: dict[str, int] = {}  # module path -> bytes of its parameters' gradients
    # module path -> bytes of its parameters that take no gradient (frozen: a LoRA fine-tune's base weights), only layers
    # that have some; known when the model is attached (before the window: the step files' head holds it); {}: none, or an
    # older file (every parameter then counts as trained)
    layer_frozen_bytes: dict[str, Count] = {}
    # module path -> most activation bytes it saved for backward in one profiled step; beside the paths, the keys
    # SAVED_OUTSIDE_LAYERS, MODEL_OUTPUT and LOSS_BACKWARD (the last new in a compatible way: an older reader skips a key
    # naming no layer, a newer one reading an older file does without it)
    layer_saved_bytes: dict[str, int] = {}
    # module path -> most bytes its forward returned in one profiled step (the gradient reaching it in backward is as large:
    # ``search.fsdp_memory``'s moments of a unit's backward, for a DDP profile turned FSDP); {}: not recorded (older files,
    # FSDP profiles, which keep theirs in ``FsdpInfo.layer_output_bytes``)
    layer_output_bytes: dict[str, Count] = {}
    # module path -> most autograd nodes its forward made in one profiled step (those between leaf modules counted with the
    # next; the model's last functional ops and the loss under SAVED_OUTSIDE_LAYERS): their host memory, on a CPU job
    # (``search.memory.autograd_host``); {}: not recorded (a job whose parameters are on a GPU, older files)
    layer_autograd_nodes: dict[str, Count] = {}
    # leaf path -> its module's class, for the paths a container numbers (an ``nn.Sequential`` root's ``6``, ``3.0.short.0``),
    # which alone say no layer: shown beside them (``analysis.critical_path.op_words``); {}: none, or an older file
    layer_types: dict[str, str] = {}
    bucket_layouts: list[BucketLayout] = []  # one per distinct layout seen, in order
    step_times_ns: list[tuple[int, int, int]] = []  # (step, begin, end) of every step seen, profiled or not
    records: list[tuple[int, int, int, int, int]]  # see ``Col`` and ``Rec``
    ddp_group_ranks: list[int] = []  # ranks DDP all-reduces over; [] = every rank (files before it was recorded)
    fsdp: FsdpInfo | None = None  # an FSDP2 job's units and collectives (absent in DDP runs and older files)
    zero: ZeroInfo | None = None  # a ZeroRedundancyOptimizer's shards and broadcasts (absent without one, and in older files)
    # (step, CPU ns, run-queue wait ns) of the thread that marked the steps (``collect.hooks.thread_sched``): per step,
    # profiled or not (older files: the profiled steps only); [] where not recorded (older files, a kernel without schedstat)
    thread_sched_ns: list[tuple[Count, Count, Count]] = []
    process_cpu_ns: list[tuple[Count, Count]] = []  # (step, the process's CPU ns, all threads) beside each of those ([]: older files)
    thread_runs: list[tuple[Count, Count]] = []  # (step, times that thread got a core: schedstat's third field) beside them ([]: older files)
    # (step, CPU ns, run-queue wait ns, runs) of the process's other threads together (gloo's, Kineto's) beside them ([]: older files)
    other_threads_ns: list[tuple[Count, Count, Count, Count]] = []


class StepPart(msgspec.Struct, kw_only=True):
    """One line of ``rank<R>.steps/steps.jsonl``: what one completed step of the window added to the rank's ``RankFile``."""

    format: str = STEP_FORMAT
    version: int = VERSION
    rank: int
    step: int
    layers: list[str] = []  # leaf modules first seen in this step (appended to the head's ``layers``)
    layer_grad_bytes: dict[str, int] = {}  # entries new or changed since the previous part
    layer_saved_bytes: dict[str, int] = {}  # what each layer saved for backward in this step
    bucket_layout: BucketLayout | None = None  # a layout first seen in this step
    warnings: list[str] = []  # new since the previous part
    step_times_ns: list[tuple[int, int, int]] = []  # steps that ended since the previous part
    records: list[tuple[int, int, int, int, int]]  # appended since the previous part (this step's, and late completions)
    thread_sched_ns: list[tuple[Count, Count, Count]] = []  # steps since the previous part, as ``RankFile.thread_sched_ns``
    process_cpu_ns: list[tuple[Count, Count]] = []  # the same steps', as ``RankFile.process_cpu_ns``
    thread_runs: list[tuple[Count, Count]] = []  # the same steps', as ``RankFile.thread_runs``
    other_threads_ns: list[tuple[Count, Count, Count, Count]] = []  # the same steps', as ``RankFile.other_threads_ns``


class Ended(msgspec.Struct, kw_only=True):
    """``rank<R>.steps/ended.json``: the signal that stopped the process, written by its handler."""

    format: str = ENDED_FORMAT
    version: int = VERSION
    rank: int
    how: str  # "stopped by SIGTERM during step 5"
    t_ns: int


_ENCODER = msgspec.json.Encoder()


def encode(doc: Manifest | RankFile | Ended) -> bytes:
    """JSON bytes of a run file (the manifest indented: people read it)."""
    data = _ENCODER.encode(doc)
    return msgspec.json.format(data, indent=1) if isinstance(doc, Manifest) else data


_KINDS = {Manifest: (FORMAT, MANIFEST), RankFile: (RANK_FORMAT, "dagprof rank file"),
          StepPart: (STEP_FORMAT, "dagprof step record"), Ended: (ENDED_FORMAT, "dagprof end-of-process file")}


def read_file(path: str | os.PathLike[str], kind: type[Manifest] | type[RankFile] | type[Ended]):
    """Decode and check one run file; every problem is a one-line ``DagprofError`` naming the file."""
    fmt, what = _KINDS[kind]
    return read_versioned(path, kind, fmt, range(MIN_VERSION, VERSION + 1), what, "profile the job again")


def encode_line(part: StepPart) -> bytes:
    """One committed line of ``steps.jsonl`` (compact JSON escapes newlines, so the line holds one)."""
    return _ENCODER.encode(part) + b"\n"


def read_step_log(path: str | os.PathLike[str]) -> tuple[list[StepPart], bool]:
    """The committed lines of a ``steps.jsonl``, and whether a last line was cut off (a kill while writing it)."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        return [], False
    lines = read_input(path).split(b"\n")  # a regular file, capped, like every input
    fmt, what = _KINDS[StepPart]
    parts = [decode_versioned(line, f"{path} line {i + 1}", StepPart, fmt, range(MIN_VERSION, VERSION + 1), what, "profile the job again")
             for i, line in enumerate(lines[:-1])]
    return parts, bool(lines[-1])


def checked_cpu_set(text: str, cpus: int | None, path: str) -> str:
    """A rank file's affinity set, refused in one line where it does not hold the cores its count says (a damaged file)."""
    if text and cpus and len(cpu_sets.cores(text)) != cpus:
        raise DagprofError(f"cpu_set {text!r} holds {len(cpu_sets.cores(text))} cores but cpus says {cpus}: a damaged rank file", path)
    return text
