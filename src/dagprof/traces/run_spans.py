"""What a dagprof run's rank becomes before its event table: spans on the main lane, collective transfers,
GPU ops. ``run_comm``/``run_partition`` (DDP's hooks) and ``fsdp_run`` (FSDP's) build them, ``run_rank`` reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .events import CommKind, CommRole, Dep, Kind, LaneKind
from .meta import InOpGroup, OptimizerOps, UnseenCollective


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
    root: int = -1  # a broadcast's issue: its root (``_Transfer.root``)
    role: CommRole = CommRole.PLAIN  # a collective's issue: its transfer's role
    comm_kind: CommKind = CommKind.UNKNOWN  # a collective's issue or in-op piece: its kind
    group_size: int = 0  # an in-op piece: its collective's group size (``EventTable.group_size``)


@dataclass
class _Comm:
    """Collective transfers of one rank, and how the hook records map onto them."""

    source: str
    transfers: list[_Transfer]
    seq_of: dict[int, int]  # comm-hook seq -> the seq used in the event table
    host: list[_Span]  # host enqueues seen only in Kineto (DDP's buffer broadcast), depth 0 on the main lane
    device: list[_DeviceOp] = field(default_factory=list)  # GPU kernels and copies (Kineto), not collectives
    unseen: dict[CommKind, UnseenCollective] = field(default_factory=dict)  # Kineto's collectives issued inside other ops, by kind
    optimizer: OptimizerOps | None = None  # FSDP2 with Kineto: what its optimizer steps ran (``fsdp_run.optimizer_ops``)
    in_op: list[_InOp] = field(default_factory=list)  # those of ``unseen`` whose bytes are known (``run_comm.in_op_sizes``)
    in_op_groups: list[InOpGroup] = field(default_factory=list)  # Kineto's collectives no hook saw, by group and dimension
    # the ranks of the data-parallel group the host collectives ran in, where the trace's pg_config tells and the rank file
    # does not (no DDP model: the user's own gradient all-reduces over DeviceMesh's "dp" group); (): the rank file's
    dp_ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class _InOp:
    """A collective the model ran inside one of its ops, blocking the calling thread (at its call, or at its wait), with
    its bytes: the main lane's span around its end is cut there (``run_partition.cut_in_op``), so that link what-ifs
    can re-price it."""

    kind: CommKind  # one of ``run_schema.OWN_KINDS``
    start: int  # ns, its transfer's start on the comm thread, or where the thread began to wait for an asynchronous one
    end: int
    nbytes: int  # as the events carry them (``CommKind.event_bytes``: an all-gather's gathered total)
    ranks: int  # its group's size


@dataclass(frozen=True)
class _DeviceOp:
    """A GPU op from Kineto, with the host calls (ns, -1 none) that launched it and that first waited for it: each becomes a
    call inside our main lane's span around it, where the graph cuts that span (a coarse hook span launches many kernels)."""

    name: str
    kind: Kind
    start: int
    end: int
    lane: str
    launch: int  # the runtime call that launched it (cudaLaunchKernel): start, end
    launch_end: int
    sync_start: int  # the host call that waited for it (a synchronize, a blocking copy): start, end, and Kineto's rule
    sync: int
    sync_rule: Dep = Dep.SYNC


@dataclass(frozen=True)
class _Transfer:
    seq: int
    bucket: int
    name: str
    start: int  # ns
    end: int
    lane: str
    nbytes: int
    lane_kind: LaneKind = LaneKind.COMM_THREAD  # GPU_STREAM for NCCL kernels
    root: int = -1  # a broadcast's root as its group numbers it where the record names it (ZeRO's owner), else -1
    role: CommRole = CommRole.PLAIN
    comm_kind: CommKind = CommKind.UNKNOWN
