"""The normalised event model every reader produces and nothing downstream bypasses.

One ``RankTrace`` per rank: a columnar ``EventTable`` (numpy arrays, one row per
op) plus the metadata needed to join ranks. Strings are interned into small
lists so the table stays a handful of flat arrays even at millions of events.
Every reader builds its table and flows with ``EventRows``.

Conventions readers must follow (the graph builder relies on them):
- times are microseconds (float64) relative to ``RankTrace.base_ns`` (Unix epoch ns), from clocks that count whole
  nanoseconds (``TIME_RESOLUTION_US``);
- ``lane`` is a sequential executor: one CPU thread or one GPU stream;
- ``depth == 0`` marks the events that become graph nodes: they never overlap on a
  lane. Wrappers such as ``ProfilerStep#N`` or ``DistributedDataParallel.forward``
  are transparent (children of a wrapper keep depth 0); ops nested in a node have depth >= 1;
- ``flows`` are intra-rank dependencies the reader knows from its format
  (CPU launch -> GPU kernel, all-reduce enqueue -> transfer, transfer -> wait); ``flow_rule``
  (one ``Dep`` per flow, empty = all ``Dep.AFTER``) says which instants each one joins;
- communication events carry ``group`` (index into ``groups``) and ``seq`` (the
  collective's position in that group on this rank), so ranks can be matched; a send or recv
  carries ``peer`` where the trace records it (the rank it exchanges with, as its group numbers it).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .buckets import BucketLayout
from .comm_kind import CommKind as CommKind  # where the readers and the graph have it from
from .meta import RankMeta, RunMeta


class Kind(enum.IntEnum):
    """What an event does, as far as scaling analysis cares."""

    OTHER = 0
    FORWARD = 1
    BACKWARD = 2
    UPDATE = 3  # optimizer step
    COMM = 4  # a collective's transfer (gloo:all_reduce, NCCL kernel)
    COMM_ENQUEUE = 5  # the host call that issues a collective (c10d::allreduce_)
    COMM_WAIT = 6  # host blocked on a collective or a device (cuda sync, copy_bucket_to_grad)
    DATA = 7  # data loading
    KERNEL = 8  # device compute kernel not attributed to forward/backward
    MEMCPY = 9
    RUNTIME = 10  # cudaLaunchKernel and friends
    STEP = 11  # iteration marker (ProfilerStep#N); in a graph, a zero-cost step boundary
    SYNC = 12  # graph only: a zero-cost join (every rank has entered a collective)


class CommRole(enum.IntEnum):
    """What a collective carries beyond its kind, where the reader that read it knows (``EventTable.role``, the graph's
    ``role`` column): set once there, so that no later stage tells it by the collective's name."""

    PLAIN = 0  # its kind, bytes and group say what it is
    SPARSE = 1  # a DDP bucket of a sparse gradient (``nn.Embedding(sparse=True)``), all-gathered: each rank's bytes are the
    # rows it touched, its own estimate of every rank's (``collect.hooks.ddp_buckets.sparse_wire_bytes``), so they differ by rank
    ZERO_PARAMS = 2  # a ZeroRedundancyOptimizer's broadcast of its owner's updated parameters (``traces.zero_run``): the
    # optimizer's data parallelism, not a collective of the job's own
    JOB = 3  # an FSDP job's own collective (``traces.fsdp_run``'s ``JOB_PHASES``: a ``DTensor.full_tensor()`` gather, a
    # blocking c10d call such as a DCP save's): of no unit, none of FSDP's collectives
    ROWS = 4  # a parameter server's pull of a row_sparse key's rows for a forward (MXNet's ``row_sparse_pull``), and its
    # call: the key's forward op waits for them (``graph.build_ps``), no server sums them
    HOOK = 5  # a DDP bucket's wire under a comm hook of the job's own: the collectives the hook issued for it, of one kind,
    # their bytes summed (an all-gather's: every rank's gathered, as a sparse bucket's; ``traces.run_comm.hook_transfer``)
    NEGOTIATION = 6  # Horovod's coordinator agreeing a cycle's responses (``traces.horovod``: rank 0's ``horovod negotiate``),
    # and the graph's join of every rank's requests before it (``graph.build``): a collective of control messages, no payload


# Host and device clocks in one trace agree to a few microseconds: an instant that precedes another by
# less than this is not evidence against a dependency between them.
CLOCK_JITTER_US = 5.0

# Every format read counts time in whole nanoseconds or coarser (Kineto's ``ts`` to three decimals of a microsecond,
# the run hooks' ``time.time_ns()``, XPlane's picosecond offsets on nanosecond clocks: none in tests/data has a fraction
# of one): two instants of a trace less than this apart are one instant that float arithmetic split (``start + dur``
# rounds; a Kineto ``ts`` of ~5e12 us parses to within half a nanosecond).
TIME_RESOLUTION_US = 1e-3


class Dep(enum.IntEnum):
    """Why a flow u -> v exists, which fixes the two instants it joins (the graph builder cuts there).

    Every rule is checkable against the measurement: v's dependent instant must not precede
    u's instant (``graph.provenance.violations`` counts the flows that do).
    """

    AFTER = 0  # v starts after u ends; a COMM_WAIT v is a wait released when u ends (readers' default)
    LAUNCH = 1  # GPU op v after the START of the runtime call u that issued it (a call may return after its op ran)
    SYNC = 2  # host sync call v (stream/event/device synchronize) is a wait released when GPU op u ends
    COPY = 3  # blocking memcpy call v (device->pageable host, synchronous cudaMemcpy) is a wait released when its copy u ends
    STAGE = 4  # pageable host->device memcpy call v first waits for its stream to drain (u: the op before the copy), then stages
    STREAM_WAIT = 5  # GPU op v waits for GPU op u on another stream (cudaStreamWaitEvent named by a cuda_sync record)
    STREAM_WAIT_PLAIN = 6  # GPU op v after a plain cudaStreamWaitEvent: waits for the latest collective u, unless the trace contradicts it
    COLL_READY = 7  # collective kernel v waits for the compute op u its thread issued before it (NCCL stream joins the current one)
    ENQUEUE = 8  # host collective transfer v after its enqueue call u (gloo: paired by order)
    COMM_WAIT = 9  # host wait v (c10d wait) released when host transfer u ends
    BACKWARD_START = 10  # the autograd thread's first op v of a step after the main thread's op u (forward/loss)
    BACKWARD_END = 11  # the main thread's op v after the autograd thread's last op u of the step (backward() returned)


class LaneKind(enum.IntEnum):
    CPU_THREAD = 0
    GPU_STREAM = 1
    COMM_THREAD = 2  # a host thread that only runs collectives (gloo runloop)


@dataclass(frozen=True)
class Lane:
    name: str  # e.g. "thread 1234 (main)", "stream 7", "pt_gloo_runloop 3"
    kind: LaneKind
    main: bool = False  # the thread that runs the training loop
    pool: bool = False  # one of a pool of interchangeable worker threads (TF's and XLA's executors): a step's ops take
    # whichever is free, so its previous op may be the previous step's (``graph.rank_nodes`` starts each step on it anew)


_COLUMNS: dict[str, Any] = {
    "name": np.int32,  # index into EventTable.names
    "kind": np.int8,  # Kind
    "lane": np.int32,  # index into RankTrace.lanes
    "start": np.float64,  # us since RankTrace.base_ns
    "dur": np.float64,  # us
    "depth": np.int16,
    "step": np.int32,  # -1 when outside the profiled steps
    "layer": np.int32,  # index into RankTrace.layers, -1 none
    # payload bytes of a collective or memcpy, 0 unknown; a collective's as ``CommKind.event_bytes`` has them (an all-gather's
    # gathered total, a reduce-scatter's whole input, a gather's or scatter's one chunk), whichever its source recorded
    "nbytes": np.int64,
    "group": np.int32,  # index into RankTrace.groups, -1 when not a collective
    "seq": np.int64,  # order of the collective within its group on this rank, -1 none
    "bucket": np.int32,  # DDP gradient bucket index, -1 none
    # the rank a rooted op names, as its group numbers it (c10d's dst/src argument): a send's or recv's peer, a broadcast's
    # root; -1 none or not recorded
    "peer": np.int32,
    "role": np.int8,  # a collective's CommRole (transfer and issue), PLAIN elsewhere
    "comm_kind": np.uint8,  # a collective's CommKind (transfer, and issue where its reader knows), UNKNOWN elsewhere
    # a collective's group size where no group of the trace's names its ranks: a piece of an op that ran the model's own
    # collective, sized (``run_partition.cut_in_op``); 0 elsewhere
    "group_size": np.int32,
}


def intern(index: dict[str, int], names: list[str], name: str) -> int:
    """``name``'s number in ``names``, appended there when new (``index``: name -> number, kept alongside): the one way
    tables of events and graph nodes store a name once and refer to it by number."""
    i = index.get(name)
    if i is None:
        i = index[name] = len(names)
        names.append(name)
    return i


@dataclass
class EventTable:
    """Columnar events. Build with ``EventTable.from_columns``; rows are events."""

    names: list[str]
    name: np.ndarray
    kind: np.ndarray
    lane: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    depth: np.ndarray
    step: np.ndarray
    layer: np.ndarray
    nbytes: np.ndarray
    group: np.ndarray
    seq: np.ndarray
    bucket: np.ndarray
    peer: np.ndarray
    role: np.ndarray
    comm_kind: np.ndarray
    group_size: np.ndarray

    COLUMNS = tuple(_COLUMNS)
    DEFAULTS = {"depth": 0, "step": -1, "layer": -1, "nbytes": 0, "group": -1, "seq": -1, "bucket": -1, "peer": -1,
                "role": int(CommRole.PLAIN), "comm_kind": int(CommKind.UNKNOWN), "group_size": 0}  # optional columns

    @classmethod
    def from_columns(cls, names: Sequence[str], **cols: Any) -> "EventTable":
        """Missing optional columns default to 0 / -1; all columns must have equal length."""
        n = len(cols["start"])
        arrays = {}
        for col, dtype in _COLUMNS.items():
            if col in cols:
                arr = np.ascontiguousarray(cols[col], dtype=dtype)
            elif col in cls.DEFAULTS:
                arr = np.full(n, cls.DEFAULTS[col], dtype=dtype)
            else:
                raise ValueError(f"EventTable needs column {col!r}")
            if arr.shape != (n,):
                raise ValueError(f"column {col!r} has shape {arr.shape}, expected ({n},)")
            arrays[col] = arr
        return cls(names=list(names), **arrays)

    @classmethod
    def empty(cls) -> "EventTable":
        return cls.from_columns([], name=[], kind=[], lane=[], start=[], dur=[])

    def __len__(self) -> int:
        return len(self.start)

    @property
    def end(self) -> np.ndarray:
        return self.start + self.dur

    def take(self, index: np.ndarray) -> "EventTable":
        """Rows selected by a boolean mask or an index array (names list shared)."""
        return EventTable(names=self.names, **{c: getattr(self, c)[index] for c in _COLUMNS})

    def name_of(self, i: int) -> str:
        return self.names[int(self.name[i])]



def nested(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per row of one lane, in order of start (the longest first at a tie), whether it starts before an earlier row ended:
    an op run inside another, not a node (depth 1), where a format does not record the nesting itself."""
    return start < np.maximum.accumulate(np.r_[-np.inf, end[:-1]])


class EventRows:
    """One rank's ``EventTable`` and flows being built: the one way a reader turns what it decoded into rows.

    Names are interned on the way in; rows come one at a time (``add``) or as numpy blocks (``add_block``, names already
    interned by ``intern``), numbered in the order they come, optional columns as ``EventTable.DEFAULTS``, every column
    in its table dtype. ``columns()`` shows the rows so far as arrays a reader may write into (a value known only once
    every row is read: a collective's bytes or seq); they stay the table's until the next row comes. ``flows`` collects
    (u, v) row pairs (a reader that infers them as arrays, each with its ``Dep``, as Kineto's does, gives them to
    ``RankTrace`` as they are). ``extending`` starts from another reader's table (Horovod's from the PyTorch run's).
    """

    def __init__(self, names: Sequence[str] = ()) -> None:
        self.names: list[str] = list(names)  # already interned: ``name`` columns given to ``add_block`` index them
        self.index = {s: i for i, s in enumerate(self.names)}
        self.flows: list[tuple[int, int]] = []
        self._blocks: list[dict[str, np.ndarray]] = []
        self._rows: dict[str, list[Any]] = {c: [] for c in _COLUMNS}
        self._n = 0

    @classmethod
    def extending(cls, table: EventTable, flows: np.ndarray | None = None) -> "EventRows":
        """``table``'s rows (copied: writing into ``columns()`` leaves it as it was) and ``flows`` (if given), to add to."""
        rows = cls(table.names)
        rows.add_block(**{c: getattr(table, c).copy() for c in _COLUMNS})
        rows.flows = [(u, v) for u, v in flows.tolist()] if flows is not None else []
        return rows

    def __len__(self) -> int:
        return self._n

    def intern(self, name: str) -> int:
        return intern(self.index, self.names, name)

    def rename(self, old: str, new: str) -> None:
        """Every row named ``old`` (if any) is named ``new`` instead (which must not be a name yet)."""
        if new in self.index:
            raise ValueError(f"cannot rename {old!r}: {new!r} names rows already")
        if old in self.index:
            i = self.index.pop(old)
            self.names[i] = new
            self.index[new] = i

    def add(self, name: str, kind: Kind | int, lane: int, start: float, dur: float, **optional: Any) -> int:
        """One row (``optional``: the columns of ``EventTable.DEFAULTS``); returns its number."""
        if not optional.keys() <= EventTable.DEFAULTS.keys():
            raise TypeError(f"not optional event columns: {sorted(optional.keys() - EventTable.DEFAULTS.keys())}")
        row = {**EventTable.DEFAULTS, **optional, "name": self.intern(name), "kind": int(kind), "lane": lane, "start": start, "dur": dur}
        for c, values in self._rows.items():
            values.append(row[c])
        self._n += 1
        return self._n - 1

    def add_block(self, **cols: Any) -> np.ndarray:
        """Rows from equal-length arrays (``name``: interned ids; arrays of the table's dtype are taken, not copied);
        returns their numbers."""
        self._flush()
        m = len(cols["start"])
        self._blocks.append({c: np.asarray(cols[c], dtype=t) if c in cols else np.full(m, EventTable.DEFAULTS[c], dtype=t)
                             for c, t in _COLUMNS.items()})
        self._n += m
        return np.arange(self._n - m, self._n)

    def columns(self) -> dict[str, np.ndarray]:
        """Every row so far, one writable array per column."""
        self._flush()
        if len(self._blocks) != 1:
            self._blocks = [{c: np.concatenate([b[c] for b in self._blocks]) if self._blocks else np.zeros(0, t)
                             for c, t in _COLUMNS.items()}]
        return self._blocks[0]

    def table(self) -> EventTable:
        return EventTable.from_columns(self.names, **self.columns())

    def flow_array(self) -> np.ndarray:
        """``flows`` as an (n, 2) int64 array, for ``RankTrace.flows``."""
        return np.asarray(self.flows, dtype=np.int64).reshape(-1, 2)

    def _flush(self) -> None:
        if self._rows["start"]:
            self._blocks.append({c: np.asarray(v, dtype=_COLUMNS[c]) for c, v in self._rows.items()})
            self._rows = {c: [] for c in _COLUMNS}


@dataclass
class RankTrace:
    """Everything known about one rank's profiled window."""

    rank: int
    world_size: int
    source: str  # the file it came from, for error messages
    events: EventTable
    lanes: list[Lane]
    base_ns: int = 0
    host: str = ""
    backend: str = ""
    layers: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)  # process-group names; "0" is the default group
    group_ranks: dict[str, list[int]] = field(default_factory=dict)
    flows: np.ndarray = field(default_factory=lambda: np.empty((0, 2), dtype=np.int64))
    flow_rule: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int8))  # Dep per flow; empty: all AFTER
    buckets: BucketLayout = ()  # the DDP bucket layout last seen (dagprof runs; Horovod's fused responses)
    meta: RankMeta = field(default_factory=RankMeta)

    def rules(self) -> np.ndarray:
        """``flow_rule``, or ``Dep.AFTER`` for every flow when the reader gave none."""
        if len(self.flow_rule) == len(self.flows):
            return self.flow_rule
        return np.full(len(self.flows), int(Dep.AFTER), dtype=np.int8)

    def step_spans(self) -> np.ndarray:
        """(step, start_us, end_us) rows from the STEP markers, sorted by step."""
        ev = self.events
        mask = ev.kind == Kind.STEP
        rows = np.stack([ev.step[mask].astype(np.float64), ev.start[mask], ev.end[mask]], axis=1)
        return rows[np.argsort(rows[:, 0], kind="stable")] if len(rows) else rows.reshape(0, 3)


@dataclass
class Run:
    """All ranks of one profiled job (or the subset of rank files present)."""

    ranks: list[RankTrace]
    source: str
    meta: RunMeta = field(default_factory=RunMeta)

    @property
    def world_size(self) -> int:
        return max((r.world_size for r in self.ranks), default=0)

    def rank(self, r: int) -> RankTrace:
        for t in self.ranks:
            if t.rank == r:
                return t
        raise KeyError(r)
