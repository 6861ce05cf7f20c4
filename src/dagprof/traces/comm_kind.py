"""What a collective does (``CommKind``), the one vocabulary of collectives from the readers on: the events' and the graph's
``comm_kind`` columns and the readers' metadata (``meta.Collectives``) carry it, each format's names read through ``CommKind.of``."""
from __future__ import annotations

import enum


class CommKind(enum.IntEnum):
    """What a collective does (``EventTable.comm_kind``, the graph's ``comm_kind`` column), set once by the reader that
    read it from its format (Kineto's collective names, the collector's records, XLA's HLO, TensorFlow's op types,
    Horovod's responses, MXNet's push and pull) or by the pass that built it, so that no later stage tells it by a name."""

    UNKNOWN = 0  # not a collective, or one whose kind its reader does not know: priced as an all-reduce of its bytes
    ALL_REDUCE = 1
    ALL_GATHER = 2
    REDUCE_SCATTER = 3
    BROADCAST = 4
    ALL_TO_ALL = 5
    SEND = 6
    RECV = 7
    SEND_RECV = 8  # NCCL's SendRecv kernel, XLA's collective-permute
    SCATTER = 9
    GATHER = 10
    REDUCE = 11
    BARRIER = 12
    PUSH = 13  # a parameter server's push of a key's gradient (MXNet's kvstore)
    PULL = 14  # its pull of the key's value
    PUSH_PULL = 15  # both in one op
    SPARSE_ALL_REDUCE = 16  # gloo's sparse_allreduce (Kineto's name for a sparse DDP bucket's): priced as an all-reduce of its bytes

    @classmethod
    def of(cls, canonical: str) -> "CommKind":
        """The kind a reader's canonical collective name (``traces.kineto_schema.canonical_collective``: ``allgather``,
        ``reducescatter``...) names; UNKNOWN for none or another."""
        return _CANONICAL_KINDS.get(canonical, cls.UNKNOWN)

    @classmethod
    def from_label(cls, label: str) -> "CommKind":
        """The kind ``label`` names (``all_gather``: the collector's FSDP records, link-model files, calibrate's sweeps)."""
        return cls[label.upper()]

    @property
    def priced_as(self) -> "CommKind":
        """The kind whose price this one takes, one rule for an FSDP job's own calls (``collect.hooks.fsdp`` records the
        group's tensors of those priced as an all-gather, ``traces.fsdp_run`` gives their nodes this kind), a DDP model's
        calls inside its ops (``costmodel.topology.per_rank_equivalent_bytes``) and a trace's collectives
        (``costmodel.topology.priced_kind``, ``rooted_factor``): a gather's or scatter's root port moves
        the group's tensors, as a ring all-gather of them does each port (its bytes: the gathered ones); a barrier an
        all-reduce of nothing; any other kind itself."""
        return _PRICED_AS.get(self, self)

    def event_bytes(self, input_bytes: int, ranks: int) -> int:
        """A collective's bytes as the events carry them (``EventTable.nbytes``) from one rank's input tensor, as Kineto's
        ``Input Dims`` (``In msg nelems``) and the collector's own-call records give it: an all-gather's its gathered
        total, the input times its group's ``ranks`` (0, unknown, where they are), as dagprof's FSDP records, TensorFlow and
        Horovod record it and ``allreduce_equivalent_bytes`` reads it; any other kind its input (a reduce-scatter's whole
        input, a gather's or scatter's one chunk). Read as gathered, a traced all-gather's chunk cost 1/N of its transfer."""
        if self != CommKind.ALL_GATHER:
            return input_bytes
        return input_bytes * ranks if ranks > 0 else 0

    @property
    def label(self) -> str:
        """The name the cost model, link-model files and the collector's FSDP records give it: ``all_gather``."""
        return self.name.lower()


_CANONICAL_KINDS = {"allreduce": CommKind.ALL_REDUCE, "allgather": CommKind.ALL_GATHER, "reducescatter": CommKind.REDUCE_SCATTER,
                    "broadcast": CommKind.BROADCAST, "alltoall": CommKind.ALL_TO_ALL, "send": CommKind.SEND, "recv": CommKind.RECV,
                    "sendrecv": CommKind.SEND_RECV, "scatter": CommKind.SCATTER, "gather": CommKind.GATHER, "reduce": CommKind.REDUCE,
                    "barrier": CommKind.BARRIER, "push": CommKind.PUSH, "pull": CommKind.PULL, "isend": CommKind.SEND,
                    "irecv": CommKind.RECV, "batchisendirecv": CommKind.SEND_RECV, "sparseallreduce": CommKind.SPARSE_ALL_REDUCE}
_PRICED_AS = {CommKind.GATHER: CommKind.ALL_GATHER, CommKind.SCATTER: CommKind.ALL_GATHER, CommKind.BARRIER: CommKind.ALL_REDUCE}
P2P = frozenset({CommKind.SEND, CommKind.RECV, CommKind.SEND_RECV})  # point to point
P2P_SEND = frozenset({CommKind.SEND})
P2P_PEERED = frozenset({CommKind.SEND, CommKind.RECV})  # one peer each (a send-recv or a batch has several)
