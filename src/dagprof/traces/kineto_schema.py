"""What Kineto writes, as typed decode structs plus ONE versioned table of names.

Decoding into ``msgspec`` structs that list only the fields dagprof reads is the
fast path (unknown keys are skipped in C), so the reader never builds a dict per
event. Every way a collective has been spelled across PyTorch / NCCL / RCCL / gloo
generations is a row of ``COMM_NAMES``: supporting a new schema is one row. Argument
spellings (``Collective name``, ``In msg nelems``, ``Seq``...) are the ``rename`` map of
``Args``; a new spelling is one entry there.

Numbers are bounded in the structs (``Meta``: checked in C while decoding), so whatever passes
the typed decode fits the reader's int64 / float64 columns; a value out of bounds or of
another type sends the file to ``kineto_decode``'s tolerant path, never into the reader.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Union

import msgspec
import numpy as np

from .events import Kind

# Ids and counts beyond 2**53 are garbage in any trace; the bound keeps bytes = count * dtype size in int64.
Int = Annotated[int, msgspec.Meta(ge=-(2**53), le=2**53)]
# Microseconds: ns = us * 1000 must fit int64 (and NaN / inf, which the lax decode admits from strings, fail it).
Micros = Annotated[float, msgspec.Meta(ge=-9e15, le=9e15)]


class Args(
    msgspec.Struct,
    gc=False,
    rename={
        "correlation": "correlation",
        "nbytes": "bytes",
        "coll": "Collective name",
        "in_nelems": "In msg nelems",
        "out_nelems": "Out msg nelems",
        "dtype": "dtype",
        "group_size": "Group size",
        "pg_name": "Process Group Name",
        "pg_ranks": "Process Group Ranks",
        "pg_desc": "Process Group Description",
        "seq": "Seq",
        "rank": "Rank",
        "dst_rank": "Dst Rank",
        "src_rank": "Src Rank",
        "concrete": "Concrete Inputs",
        "input_dims": "Input Dims",
        "input_type": "Input type",
        "wait_on_stream": "wait_on_stream",
        "wait_on_record": "wait_on_cuda_event_record_corr_id",
        "stream": "stream",
        "device": "device",
    },
):
    correlation: Int = -1
    nbytes: Int = 0
    coll: str = ""
    in_nelems: Int = -1
    out_nelems: Int = -1
    dtype: str = ""
    group_size: Int = -1
    pg_name: msgspec.Raw = msgspec.Raw()  # a string in most traces, an int in some
    pg_ranks: msgspec.Raw = msgspec.Raw()
    pg_desc: str = ""  # "mesh_tp" (DeviceMesh), "default_pg", "undefined": can tell the group's mesh dimension
    seq: Int = -1
    rank: Int = -1  # a send/recv's record: its peer's rank in the group (a collective's: the rank's own)
    dst_rank: Int = -1  # a send's record (recent torch, NCCL): its peer's global rank
    src_rank: Int = -1  # a recv's record: its peer's global rank
    concrete: msgspec.Raw = msgspec.Raw()  # scalar inputs (record_shapes): c10d::send/recv_'s third is the peer's group rank
    input_dims: msgspec.Raw = msgspec.Raw()  # nested lists, parsed only for collectives
    input_type: msgspec.Raw = msgspec.Raw()
    wait_on_stream: Int = -1
    wait_on_record: Int = -1
    stream: Int | str = -1
    device: Int | str = -1
    name: msgspec.Raw = msgspec.Raw()  # metadata events: thread / process name
    labels: msgspec.Raw = msgspec.Raw()  # metadata events: "CPU", "GPU 0"


NO_TIME = float("nan")  # a missing ts or dur: the decode drops such complete events (counted), never reads them as 0


class Event(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event (``"ph": "X"``): every op dagprof reads. ``ph`` is the decode's tag, not a field: each phase
    decodes into its own struct (``AnyEvent``), and the phases dagprof never reads keep no field at all, so their
    strings and arguments are skipped in C (flow and instant events are four in ten of a GPU trace)."""

    ph: ClassVar[str] = "X"
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: Micros = NO_TIME
    dur: Micros = NO_TIME
    args: Args | None = None


class MetaEvent(Event, tag="M"):
    """Metadata (thread and process names), with the same fields."""

    ph: ClassVar[str] = "M"


class InstantEvent(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    """An instant event: only its name and category are read (torch.profiler's marks)."""

    ph: ClassVar[str] = "i"
    name: str = ""
    cat: str = ""


# Every other phase of the Chrome trace format (and the deprecated "I" instant), read as nothing at all.
_SKIPPED_PHASES = ("I", "B", "E", "C", "b", "n", "e", "S", "T", "p", "F", "s", "t", "f", "P", "N", "O", "D", "V", "v", "R", "c", "(", ")")
SKIPPED = tuple(msgspec.defstruct(f"Skipped{i}", [("ph", ClassVar[str], ph)], tag_field="ph", tag=ph, gc=False)
                for i, ph in enumerate(_SKIPPED_PHASES))
PHASES = frozenset(("X", "M", "i", *_SKIPPED_PHASES))
AnyEvent = Union[(Event, MetaEvent, InstantEvent, *SKIPPED)]  # noqa: UP007 (a union built from a tuple)


class Unread(msgspec.Struct, gc=False):
    """An event with no phase, or one the format does not define: read as nothing (never decoded into; ``IGNORED``)."""

    ph: ClassVar[str] = ""


IGNORED = Unread()


class Head(msgspec.Struct, gc=False):
    """The top level of a trace, its events left undecoded (``kineto_decode`` reads them a chunk at a time)."""

    traceEvents: msgspec.Raw = msgspec.Raw()
    distributedInfo: msgspec.Raw = msgspec.Raw()
    baseTimeNanoseconds: Annotated[int, msgspec.Meta(ge=-(2**62), le=2**62)] | None = None
    schemaVersion: msgspec.Raw = msgspec.Raw()
    deviceProperties: msgspec.Raw = msgspec.Raw()
    host_name: str = ""


HEAD_DECODER = msgspec.json.Decoder(Head)
EVENTS_DECODER = msgspec.json.Decoder(list[AnyEvent])
# The same structs, numbers written as strings ("bytes": "1", as TraceLens/ROCm and vLLM traces have) accepted.
LAX_EVENTS_DECODER = msgspec.json.Decoder(list[AnyEvent], strict=False)
LAX_EVENT_DECODER = msgspec.json.Decoder(AnyEvent, strict=False)
LAX_ARGS_DECODER = msgspec.json.Decoder(Args, strict=False)


# ---------------------------------------------------------------- collectives
class Role:
    """Where in a collective's life an event sits."""

    ENQUEUE = "enqueue"  # host call issuing it (c10d::allreduce_)
    META = "meta"  # host record carrying its arguments (record_param_comms, nccl:* annotation)
    TRANSFER = "transfer"  # the data movement itself (NCCL/RCCL kernel, gloo:* on a runloop thread)
    WAIT = "wait"  # host waiting for it


@dataclass(frozen=True)
class CommName:
    since: str  # the first generation that wrote it (documentation, and for readers of this table)
    cat: str  # Kineto category the row applies to ("" = any)
    pattern: re.Pattern[str]  # group 1, when present, is the collective name
    role: str


def _row(since: str, cat: str, pattern: str, role: str) -> CommName:
    return CommName(since, cat, re.compile(pattern), role)


# First matching row wins: order from the most specific to the most general.
COMM_NAMES: tuple[CommName, ...] = (
    _row("torch 1.x", "cpu_op", r"^c10d::(?:\w*wait\w*)$", Role.WAIT),
    _row("torch 1.13", "", r"^torch\.distributed\.ddp\.reducer::copy_bucket_to_grad$", Role.WAIT),
    _row("torch 2.x", "cpu_op", r"^_c10d_functional::wait_tensor$", Role.WAIT),  # DTensor's and functional collectives' wait
    _row("torch 1.x", "cpu_op", r"^c10d::_?(\w+?)_?$", Role.ENQUEUE),
    _row("torch 1.13", "cpu_op", r"^record_param_comms$", Role.META),
    _row("torch 1.13", "user_annotation", r"^nccl:_?(\w+)$", Role.META),
    _row("torch 2.x gloo", "user_annotation", r"^gloo:_?(\w+)$", Role.TRANSFER),
    _row("NCCL <2.19", "kernel", r"^ncclKernel_([A-Za-z]+)_", Role.TRANSFER),
    _row("NCCL >=2.19", "kernel", r"^ncclDevKernel_([A-Za-z]+)", Role.TRANSFER),
    _row("NCCL >=2.27", "kernel", r"^ncclSymDevKernel_([A-Za-z]+)", Role.TRANSFER),
    _row("RCCL", "kernel", r"^(?:void )?rccl\w*?(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|AllToAll)", Role.TRANSFER),
)


_CANON_DROP = re.compile(r"_?(base|coalesced|tensor|into|single)$")


def canonical_collective(raw: str) -> str:
    """'all_reduce', 'AllReduce', 'allreduce_', '_allgather_base' -> 'allreduce', 'allgather': what ``CommKind.of`` reads."""
    s = raw.lower().strip("_")
    prev = None
    while prev != s:
        prev, s = s, _CANON_DROP.sub("", s).strip("_")
    s = s.replace("_", "")
    return {"alltoallv": "alltoall"}.get(s, s)


def comm_role(cat: str, name: str) -> tuple[str, str] | None:
    """(role, canonical collective) of an event, or None when it is not communication."""
    for row in COMM_NAMES:
        if row.cat and row.cat != cat:
            continue
        m = row.pattern.match(name)
        if m:
            coll = canonical_collective(m.group(1)) if m.groups() and m.group(1) else ""
            return row.role, coll
    return None


_DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4,
    "double": 8, "float64": 8, "long": 8, "int64": 8, "uint64": 8, "long int": 8,
    "half": 2, "float16": 2, "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "bf16": 2, "f16": 2, "short": 2, "int16": 2, "uint16": 2,
    "byte": 1, "char": 1, "signed char": 1, "unsigned char": 1, "int8": 1, "int8_t": 1, "uint8": 1, "uint8_t": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "f32": 4, "f64": 8, "u8": 1, "i8": 1, "i32": 4, "i64": 8,
}


def dtype_bytes(dtype: str) -> int:
    """Element size of a dtype as any generation spells it; 0 when unknown."""
    return _DTYPE_BYTES.get(dtype.strip().lower(), 0)


_KERNEL_DTYPE = re.compile(r"_(float|half|bf16|double|int8_t|uint8_t|int32_t|uint32_t|int64_t|uint64_t|f16|f32|f64|fp8_e4m3|fp8_e5m2)(?:_|\(|$)")


def kernel_dtype(name: str) -> str:
    """dtype spelled in an NCCL kernel name (ncclKernel_AllReduce_RING_LL_Sum_float), '' if none."""
    m = _KERNEL_DTYPE.search(name)
    return m.group(1) if m else ""


# ---------------------------------------------------------------- other kinds
# Kineto's first generation (2021: PyTorch 1.8/1.9, e.g. the TensorBoard plugin samples) spelled categories differently.
OLD_CATS = {"Operator": "cpu_op", "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset",
            "Runtime": "cuda_runtime", "Driver": "cuda_driver", "User annotation": "user_annotation"}
SYNC_RUNTIME = re.compile(r"^(cuda|hip)(StreamSynchronize|DeviceSynchronize|EventSynchronize|CtxSynchronize|Memcpy|MemcpyDtoH|MemcpyHtoD"
                          r"|StreamQuery_blocking)$")
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "Runtime"})
SKIP_CATS = frozenset({"Trace", "gpu_user_annotation", "python_function", "cuda_sync", "cpu_instant_event", "ac2g", "fwdbwd"})

# Wrappers (record_function ranges) are transparent; some tell what their children do.
WRAPPER_CONTEXT: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"^ProfilerStep#"), -1),
    (re.compile(r"^Optimizer\.step#|^Optimizer\.step$|optimizer", re.I), int(Kind.UPDATE)),
    (re.compile(r"^Optimizer\.zero_grad"), int(Kind.OTHER)),
    (re.compile(r"DataLoader|dataloader"), int(Kind.DATA)),
    (re.compile(r"backward", re.I), int(Kind.BACKWARD)),
    (re.compile(r"forward", re.I), int(Kind.FORWARD)),
)
BACKWARD_OP = re.compile(r"^autograd::engine::evaluate_function|Backward\d*$|^torch::autograd::AccumulateGrad$")
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")


# ---------------------------------------------------------------- per distinct (category, name)
@dataclass
class NameInfo:
    kind: int  # own kind, Kind.OTHER when it takes its context's
    wrapper: bool
    ctx: int  # context it sets for its children, -1 none
    role: str  # kineto_schema.Role or ""
    coll: str
    step: int


def classify(cat: str, name: str) -> NameInfo:
    cat = OLD_CATS.get(cat, cat)
    comm = comm_role(cat, name)
    role, coll = comm if comm else ("", "")
    if cat in GPU_CATS:
        kind = Kind.COMM if role == Role.TRANSFER else Kind.MEMCPY if cat != "kernel" else Kind.KERNEL
        return NameInfo(int(kind), False, -1, role, coll, -1)
    if cat in RUNTIME_CATS:
        kind = Kind.COMM_WAIT if SYNC_RUNTIME.match(name) else Kind.RUNTIME
        return NameInfo(int(kind), False, -1, "", "", -1)
    if role == Role.TRANSFER:
        return NameInfo(int(Kind.COMM), False, -1, role, coll, -1)
    if role == Role.WAIT:
        return NameInfo(int(Kind.COMM_WAIT), False, -1, role, coll, -1)
    if role in (Role.ENQUEUE, Role.META):
        return NameInfo(int(Kind.COMM_ENQUEUE), False, -1, role, coll, -1)
    m = STEP_NAME.match(name)
    if m:
        return NameInfo(int(Kind.STEP), True, -1, "", "", int(m.group(1)))
    if cat == "user_annotation":
        ctx = -1
        for pattern, k in WRAPPER_CONTEXT:
            if pattern.search(name):
                ctx = k
                break
        return NameInfo(int(Kind.OTHER), True, ctx, "", "", -1)
    if BACKWARD_OP.search(name):
        return NameInfo(int(Kind.BACKWARD), False, int(Kind.BACKWARD), "", "", -1)
    if "DataLoader" in name:
        return NameInfo(int(Kind.DATA), False, int(Kind.DATA), "", "", -1)
    return NameInfo(int(Kind.OTHER), False, -1, "", "", -1)


# ---------------------------------------------------------------- a collective's arguments
def _dims_elems(dims: Any) -> int:
    """Elements of the first input (a tensor's dims, or a tensor list's)."""
    if not isinstance(dims, list) or not dims:
        return 0
    first = dims[0]
    if _is_shape(first):
        return int(np.prod(first))
    if isinstance(first, list) and first and all(isinstance(x, list) and (not x or _is_shape(x)) for x in first):
        return sum(int(np.prod(d)) if d else 0 for d in first)
    return 0  # no tensor's dims (a damaged trace nesting lists past numpy's 64 dimensions among them): as unrecorded


def _is_shape(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(v, int) for v in x)


def input_elems(e: Event) -> int:
    """Elements of an op's first input (a tensor, or a tensor list as c10d calls take), -1 when unrecorded."""
    a = e.args
    if a is None:
        return -1
    if a.in_nelems >= 0:
        return a.in_nelems
    return _dims_elems(raw_value(a.input_dims)) if len(a.input_dims) else -1


def collective_args(records: list[Event]) -> dict[str, Any]:
    """The richest description any of a collective's records gives (transfer first, then host records)."""
    out: dict[str, Any] = {}
    for e in records:
        a = e.args
        if a is None:
            continue
        if a.coll and "coll" not in out:
            out["coll"] = canonical_collective(a.coll)
        if len(a.pg_name) and "group" not in out and raw_value(a.pg_name) is not None:
            out["group"] = str(raw_value(a.pg_name))
        if a.pg_desc and "desc" not in out:
            out["desc"] = a.pg_desc
        if a.seq >= 0 and "seq" not in out:
            out["seq"] = a.seq
        if "peer" not in out and a.rank >= 0 and max(a.dst_rank, a.src_rank) >= 0:  # a send's or recv's record
            out["peer"], out["peer_global"] = a.rank, max(a.dst_rank, a.src_rank)
        if len(a.pg_ranks) and "ranks" not in out:
            r = raw_value(a.pg_ranks)
            try:
                out["ranks"] = [int(x) for x in (json.loads(r) if isinstance(r, str) else r)]
            except (ValueError, TypeError):
                pass
        if "nbytes" not in out:
            dtype = a.dtype
            nelems = a.in_nelems if a.in_nelems >= 0 else -1
            if nelems < 0 and len(a.input_dims):
                dims = raw_value(a.input_dims)
                types = raw_value(a.input_type)
                dtype = dtype or (types[0] if isinstance(types, list) and types and isinstance(types[0], str) else "")
                # a 0-dim tensor (a loss all-reduced for logging: gloo:all_reduce dims [[]]) holds one element
                nelems = 1 if isinstance(dims, list) and dims == [[]] and dtype_bytes(dtype) else _dims_elems(dims)
            if nelems > 0 and dtype_bytes(dtype):
                out["nbytes"] = nelems * dtype_bytes(dtype)
                out["dtype"] = dtype
    return out


def scalar_input(e: Event, k: int) -> int:
    """An op's ``k``-th input when the trace recorded it as an integer (``Concrete Inputs``, under record_shapes), else -1:
    c10d::send(tensors, group, dst, tag) and c10d::recv_(tensors, group, src, tag) name their peer's group rank there."""
    values = raw_value(e.args.concrete) if e.args is not None and len(e.args.concrete) else None
    if isinstance(values, list) and len(values) > k and isinstance(values[k], str) and values[k].isdigit():
        return int(values[k])
    return -1


def raw_value(value: msgspec.Raw) -> Any:
    """A lazily decoded field; None when the trace did not have it, or has bytes there that are not JSON text
    (the typed decode skips raw fields without checking their UTF-8)."""
    try:
        return msgspec.json.decode(value) if len(value) else None
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nested deeper than any trace
        return None
