"""A collective's kind (``traces.events.CommKind``) is set once, by the reader that read it from its format or by the
pass that built it, rides ``EventTable.comm_kind`` and the graph's ``comm_kind`` column, and is what the cost model
prices: no stage after the reader tells it from a collective's name."""
from __future__ import annotations

import msgspec
import numpy as np
import pytest
from testdata import DATA

from dagprof.costmodel.topology import KIND_FACTORS, allreduce_equivalent_factor, per_rank_equivalent_bytes, priced_kind
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import FSDP_KINDS, allreduce_equivalent_bytes, fsdp_collectives, job_collective_steps
from dagprof.graph.dag import DeviceKind, GraphBuilder
from dagprof.passes.buckets import partition_tensors
from dagprof.passes.data_parallel import to_data_parallel
from dagprof.passes.workers import scale_workers
from dagprof.traces.events import CommKind, CommRole, EventTable, Kind
from dagprof.traces.kineto_schema import canonical_collective
from dagprof.traces.load import load
from dagprof.traces.meta import Collectives

K = CommKind
# per input, the kind of each of rank 0's transfers by the name its reader gave it (names stay what users see)
READERS = {
    "run_schema/v1": {"allreduce bucket 0": K.ALL_REDUCE},  # the collector's comm-hook records
    "ddp-fresh/sparse": {"allgather sparse bucket 0": K.ALL_GATHER, "allreduce bucket 3": K.ALL_REDUCE},
    "zero1/kineto": {"broadcast ZeRO params of rank 1": K.BROADCAST, "broadcast": K.BROADCAST, "allreduce bucket 0": K.ALL_REDUCE},
    "fsdp/reshard": {"all_gather blocks.0": K.ALL_GATHER, "reduce_scatter blocks.0": K.REDUCE_SCATTER},  # FSDP records
    "kineto-public/nccl_parser_config": {"ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)": K.BROADCAST,
                                         "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": K.ALL_REDUCE},  # NCCL kernels
    "tf/text": {"adam/CollectiveGatherV2": K.ALL_GATHER, "adam/CollectiveReduceV2": K.ALL_REDUCE},  # TF op types
    "tf-jax/mlp": {"all-reduce.6": K.ALL_REDUCE},  # XLA's HLO
    "horovod/sparse-gru": {"horovod allgather embed.weight.values": K.ALL_GATHER, "horovod allreduce decoder.bias": K.ALL_REDUCE},
    "mxnet": {"KVStoreDistDefaultStoragePushPull": K.PUSH_PULL},
}


def test_one_vocabulary():
    """The readers' canonical names and the cost model's labels name the same kinds; an unknown name is UNKNOWN."""
    for raw, kind in [("all_reduce", K.ALL_REDUCE), ("_allgather_base", K.ALL_GATHER), ("reduce_scatter_tensor", K.REDUCE_SCATTER),
                      ("alltoallv", K.ALL_TO_ALL), ("broadcast", K.BROADCAST), ("send", K.SEND), ("recv", K.RECV), ("barrier", K.BARRIER),
                      ("isend", K.SEND), ("irecv", K.RECV), ("batch_isend_irecv", K.SEND_RECV), ("sparse_all_reduce", K.SPARSE_ALL_REDUCE)]:
        assert CommKind.of(canonical_collective(raw)) == kind
    assert CommKind.of("") == CommKind.of("frobnicate") == K.UNKNOWN
    assert all(CommKind.from_label(k.label) == k for k in CommKind)
    assert [k.label for k in KIND_FACTORS] == ["all_gather", "reduce_scatter", "all_reduce", "all_to_all"]  # link-model files' kinds
    assert EventTable.DEFAULTS["comm_kind"] == K.UNKNOWN and EventTable.empty().comm_kind.dtype == np.uint8


@pytest.mark.parametrize("folder", ["kineto-public/nccl_parser_config", "tf/text", "tf-jax/mlp", "horovod/sparse-gru", "fsdp/reshard"])
def test_the_readers_metadata_names_each_collective_by_its_kind(folder):
    """``meta.Collectives`` names the collective each transfer's call ran by a ``CommKind`` too (no second vocabulary of
    names), one the transfers' column agrees with here, and the parse cache's JSON keeps it."""
    t = load(str(DATA / folder), allow_missing_ranks=True).ranks[0]
    info = t.meta.collectives
    assert info.kind and all(type(k) is CommKind and k != K.UNKNOWN for k in info.kind)
    assert [int(t.events.comm_kind[e]) for e in info.event] == [int(k) for k in info.kind]
    assert msgspec.json.decode(msgspec.json.encode(info), type=Collectives) == info


@pytest.mark.parametrize("folder", sorted(READERS))
def test_each_reader_sets_the_kind_of_every_transfer(folder):
    run = load(str(DATA / folder), allow_missing_ranks=True)
    for t in run.ranks:
        ev = t.events
        comm = np.flatnonzero(ev.kind == Kind.COMM)
        assert len(comm) and (ev.comm_kind[comm] != K.UNKNOWN).all()
        assert (ev.comm_kind[~np.isin(ev.kind, (Kind.COMM, Kind.COMM_ENQUEUE))] == K.UNKNOWN).all()  # nothing else has a kind
    ev = run.ranks[0].events
    got = {ev.name_of(i): CommKind(int(ev.comm_kind[i])) for i in np.flatnonzero(ev.kind == Kind.COMM).tolist()}
    assert {n: got.get(n) for n in READERS[folder]} == READERS[folder]


def test_the_graph_carries_each_collectives_kind_from_its_events():
    """Every shared collective node (and its join) has its transfers' kind; so do the copies ``--workers`` and
    ``partition_tensors`` make of them."""
    run = load(str(DATA / "ddp-fresh" / "sparse"))
    g = build_graph(run)
    shared = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    by_bucket = {int(g.bucket[v]): int(g.comm_kind[v]) for v in shared.tolist()}
    assert by_bucket == {0: K.ALL_GATHER, 1: K.ALL_GATHER, 2: K.ALL_GATHER, 3: K.ALL_REDUCE}
    syncs = np.flatnonzero((g.kind == Kind.SYNC) & (g.bucket >= 0))
    assert {int(g.comm_kind[v]) for v in syncs.tolist()} == {K.ALL_GATHER, K.ALL_REDUCE}
    for h in (scale_workers(g, 4), partition_tensors(build_graph(load(str(DATA / "run_schema" / "v1"))), 2)):
        comm = (h.kind == Kind.COMM) & (h.rank < 0) & (h.bucket >= 0)
        assert comm.any() and (h.comm_kind[comm] != K.UNKNOWN).all()


def test_passes_that_build_collectives_set_their_kind():
    """``--data-parallel fsdp`` builds FSDP's all-gathers and reduce-scatters from a DDP profile: each node has its kind."""
    g = to_data_parallel(build_graph(load(str(DATA / "fsdp" / "ddp"))), "fsdp")
    shared = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    kinds = {g.node_name(int(v)).partition(" ")[0]: CommKind(int(g.comm_kind[v])) for v in shared.tolist()}
    assert kinds == {"all_gather": K.ALL_GATHER, "reduce_scatter": K.REDUCE_SCATTER}


def test_the_price_reads_the_kind_not_the_name():
    """A collective named like an all-reduce but of kind ALL_GATHER costs half an all-reduce of its bytes; one whose
    kind nobody knew costs an all-reduce of them, whatever its name says."""
    b = GraphBuilder()
    d = b.device("group 0", DeviceKind.COMM)
    gathered = b.add_node("allreduce bucket 0.0", Kind.COMM, device=d, nbytes=1000, comm_kind=K.ALL_GATHER)
    unknown = b.add_node("all_gather x.1", Kind.COMM, device=d, nbytes=1000)
    g = b.build()
    assert allreduce_equivalent_bytes(g, np.array([gathered, unknown])).tolist() == [500.0, 1000.0]
    assert [priced_kind(k) for k in (K.SEND, K.UNKNOWN, K.ALL_TO_ALL, K.BROADCAST)] == [K.ALL_REDUCE, K.ALL_REDUCE, K.ALL_TO_ALL, K.BROADCAST]
    assert allreduce_equivalent_factor(K.REDUCE_SCATTER, "gloo") == 1.0 and allreduce_equivalent_factor(K.REDUCE_SCATTER, "nccl") == 0.5
    # a scatter's chunk of 10 bytes on 4 ranks costs the all-gather of the 4 chunks (its bytes the gathered 40: ``CommKind.event_bytes``)
    assert per_rank_equivalent_bytes(K.SCATTER, 10.0, 4) == per_rank_equivalent_bytes(K.ALL_GATHER, K.ALL_GATHER.event_bytes(10, 4), 4) == 20.0


def test_an_fsdp_jobs_own_collectives_are_marked_not_named():
    """The job's ``DTensor.full_tensor()`` gathers (``vit-save``: a state_dict gathered for a save) are all-gathers of role
    JOB: none of FSDP's collectives, their steps found by the role, not by the name's first word."""
    g = build_graph(load(str(DATA / "fsdp-fresh" / "vit-save")))
    own = (g.kind == Kind.COMM) & (g.rank < 0) & (g.role == CommRole.JOB)
    assert own.any() and set(g.comm_kind[own].tolist()) == {K.ALL_GATHER}
    assert not {c.node for c in fsdp_collectives(g)} & set(np.flatnonzero(own).tolist())
    assert job_collective_steps(g).tolist() == np.unique(g.step[own]).tolist()
    assert {c.kind for c in fsdp_collectives(g)} <= set(FSDP_KINDS)


@pytest.mark.parametrize("folder", ["tf/text", "horovod/sparse-gru"])
def test_tf_and_horovod_sparse_gathers_gather_more_with_more_workers(folder):
    """TensorFlow's and Horovod's all-gathers of an embedding's sparse gradient (values and indices, each rank the rows
    its step touched) are SPARSE, as DDP's sparse buckets: on 4x the ranks they gather 4x the bytes (a ring all-gather
    sends (N-1) x a rank's rows through each port), where the all-reduces keep theirs."""
    g = build_graph(load(str(DATA / folder)))
    comm = (g.kind == Kind.COMM) & (g.rank < 0)
    sparse = comm & (g.role == CommRole.SPARSE)
    assert sparse.any() and (comm & ~sparse).any()
    assert set(g.comm_kind[sparse].tolist()) == {K.ALL_GATHER} and K.ALL_GATHER not in set(g.comm_kind[comm & ~sparse].tolist())
    h = scale_workers(g, 8)
    hc = (h.kind == Kind.COMM) & (h.rank < 0)
    assert h.nbytes[hc & (h.role == CommRole.SPARSE)].sum() == 4 * g.nbytes[sparse].sum()
    assert h.nbytes[hc & (h.role != CommRole.SPARSE)].sum() == g.nbytes[comm & ~sparse].sum()


def test_xlas_all_gathers_are_no_sparse_gradients():
    """JAX's all-gathers (``tf-jax/fsdp-conv``: parameters sharded over the ranks, gathered whole) keep their bytes with
    more ranks: all-gathers, not SPARSE."""
    run = load(str(DATA / "tf-jax" / "fsdp-conv"))
    ev = run.ranks[0].events
    gathers = (ev.kind == Kind.COMM) & (ev.comm_kind == K.ALL_GATHER)
    assert gathers.any() and (ev.role[gathers] == CommRole.PLAIN).all()


def test_one_pricing_rule_for_gathers_scatters_and_barriers():
    """``CommKind.priced_as``: the FSDP reader's job calls and the in-op pieces' bytes price a gather or scatter as the
    all-gather its root's port carries, a barrier as an all-reduce; every other kind as itself."""
    assert [k.priced_as for k in (K.GATHER, K.SCATTER, K.BARRIER)] == [K.ALL_GATHER, K.ALL_GATHER, K.ALL_REDUCE]
    assert all(k.priced_as == k for k in K if k not in (K.GATHER, K.SCATTER, K.BARRIER))
    assert per_rank_equivalent_bytes(K.GATHER, 10.0, 4) == per_rank_equivalent_bytes(K.ALL_GATHER, K.ALL_GATHER.event_bytes(10, 4), 4)
    assert per_rank_equivalent_bytes(K.BARRIER, 10.0, 4) == per_rank_equivalent_bytes(K.ALL_REDUCE, 10.0, 4)


def test_a_traced_gather_or_scatter_is_priced_as_the_all_gather_of_every_ranks_chunk():
    """The link model's kind for a graph's collective (``priced_kind``) follows ``CommKind.priced_as``: a Kineto gather or
    scatter (one rank's chunk, as gloo's events record it) costs the all-gather of the N chunks, N/2 all-reduces of its
    bytes (1 on 2 ranks, 2 on 4), where it had cost one all-reduce of them on any N."""
    assert [priced_kind(k) for k in (K.GATHER, K.SCATTER, K.BARRIER)] == [K.ALL_GATHER, K.ALL_GATHER, K.ALL_REDUCE]
    assert all(priced_kind(k) == priced_kind(k.priced_as) for k in K)
    assert [allreduce_equivalent_factor(K.GATHER, "gloo", n) for n in (2, 4, 8)] == [1.0, 2.0, 4.0]
    b = GraphBuilder()
    d = b.device("group 0", DeviceKind.COMM)
    b.add_node("rank3.step", Kind.OTHER, rank=3, device=b.device("rank3", DeviceKind.COMPUTE, rank=3))  # 4 ranks
    nodes = [b.add_node(f"{k.label}.{i}", Kind.COMM, device=d, nbytes=1000, comm_kind=k) for i, k in enumerate((K.GATHER, K.SCATTER, K.ALL_REDUCE))]
    assert allreduce_equivalent_bytes(b.build(), np.array(nodes)).tolist() == [2000.0, 2000.0, 1000.0]
