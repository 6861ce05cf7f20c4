"""What a dagprof run's rank becomes before its event table: spans on the main lane, collective transfers,
GPU ops. ``run_comm``/``run_partition`` (DDP's hooks) and ``fsdp_run`` (FSDP's) build them, ``run_rank`` reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .events import Kind, LaneKind


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


@dataclass
class _Comm:
    """Collective transfers of one rank, and how the hook records map onto them."""

    source: str
    transfers: list[_Transfer]
    seq_of: dict[int, int]  # comm-hook seq -> the seq used in the event table
    host: list[_Span]  # host enqueues seen only in Kineto (DDP's buffer broadcast), depth 0 on the main lane
    device: list[_DeviceOp] = field(default_factory=list)  # GPU kernels and copies (Kineto), not collectives
    unseen: dict[str, int] = field(default_factory=dict)  # Kineto's collectives issued inside other ops: canonical name -> count


@dataclass(frozen=True)
class _DeviceOp:
    """A GPU op from Kineto; ``launch``/``sync`` (ns, -1 none) place its host-side ends on our main lane."""

    name: str
    kind: Kind
    start: int
    end: int
    lane: str
    launch: int  # when the host launched it (cudaLaunchKernel)
    sync: int  # when a host synchronisation that waited for it ended


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
