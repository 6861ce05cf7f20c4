"""ZeRO-1 (``ZeroRedundancyOptimizer`` over AdamW under DDP) on its real recordings (tests/data/zero1, made from
bench/ddp_fresh/zero1_adam.py): the parameter broadcasts after the optimizer step are seen in their own step, named
and sized, priced by link what-ifs; ``--workers`` shrinks each rank's step with its shard; the optimizer state in the
peak memory is the largest shard's; ``--data-parallel fsdp`` is refused; a hooks-only profile says what it cannot see."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from testdata import DATA

from dagprof.costmodel.collectives import allreduce_us
from dagprof.costmodel.topology import broadcast_factor, broadcast_sends
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.passes.comm import current_topology
from dagprof.passes.data_parallel import to_data_parallel
from dagprof.passes.link_fit import profiled_comm
from dagprof.passes.workers import scale_workers
from dagprof.passes.zero import even_share_note, shard_bytes, zero_state_share
from dagprof.pipeline import open_run
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import CommKind, Kind
from dagprof.traces.run_schema import ZeroInfo
from dagprof.units import MB

ZERO = DATA / "zero1"


@pytest.fixture(scope="module")
def graph():
    return build_graph(read_run(ZERO / "kineto"))


def zero_comms(g) -> np.ndarray:
    return np.array([v for v in np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0)).tolist()
                     if g.node_name(v).startswith("broadcast ZeRO params of rank ")], dtype=np.int64)


def test_broadcasts_are_named_and_sized_in_their_own_step(graph):
    """Every step holds one broadcast per parameter (the recorded list), summing to the model's bytes; each follows
    its rank's optimizer step (the collector ends the step at ZeRO's own step, not at its local AdamW's)."""
    zero = graph.meta.zero
    assert zero is not None and zero.optimizer == "AdamW" and zero.world_size == 2
    comms = zero_comms(graph)
    for s in graph.meta.steps:
        mine = comms[graph.step[comms] == s]
        assert len(mine) == len(zero.nbytes)
        assert int(graph.nbytes[mine].sum()) == sum(zero.nbytes)
    for r in range(2):
        update = np.flatnonzero((graph.kind == Kind.UPDATE) & (graph.rank == r))
        assert len(update) == len(graph.meta.steps)  # one local step each, cut where the first broadcast is issued
        src = np.repeat(np.arange(len(graph)), np.diff(graph.indptr))
        joins = src[np.isin(graph.succ, comms)]  # each broadcast's join (SYNC), then the enqueues that feed it
        issued = src[np.isin(graph.succ, joins) & (graph.rank[src] == r) & (graph.kind[src] == Kind.COMM_ENQUEUE)]
        for v in update.tolist():  # each broadcast is issued in its step after the local step (order: the profiled start)
            mine = issued[graph.step[issued] == graph.step[v]]
            assert len(mine) == len(zero.nbytes) and (graph.order[mine] > graph.order[v]).all()


def test_link_what_ifs_reprice_the_broadcasts(graph):
    """The broadcasts carry bytes, so the link is fitted to them and a slower one re-prices them (before: 0 B, kept)."""
    comms = zero_comms(graph)
    assert set(comms.tolist()) <= set(profiled_comm(graph, overlapping=True).tolist())
    # each starts by its issuing call's end: gloo's thread coming free (the other thread's broadcast on the link) is no
    # join lag kept as measured, so all their time is the link's
    assert graph.gap[comms].sum() == 0.0 and graph.dur[comms].sum() > 0.0
    res = evaluate(graph, [Scenario(bandwidth="20Mbit"), Scenario(bandwidth="10Mbit")], tolerance_pct=None)
    fast, slow = (s.predicted_iter_ms for s in res["scenarios"])
    wire_ms = sum(graph.meta.zero.nbytes) * 8 / 10e6 * 1e3  # the broadcasts alone at 10 Mbit/s
    assert slow - fast > 0.5 * wire_ms


def test_shard_bytes_repeats_torchs_greedy_partition():
    zero = ZeroInfo(optimizer="AdamW", world_size=2, owners=[0, 0, 1, 1, 1], nbytes=[8, 1, 8, 1, 1])
    assert shard_bytes(zero, 2) == [9, 10]  # as profiled
    assert shard_bytes(zero, 4) == [8, 8, 2, 1]
    bucketed = ZeroInfo(optimizer="AdamW", world_size=2, owners=[0, 1], nbytes=[10, 10])
    assert shard_bytes(bucketed, 4) == [5, 5, 5, 5]  # one bucket per owner: even shares


def test_even_shares_of_buckets_are_said_with_their_count():
    """A bucketed ZeRO-1's shards on other worker counts are a guess (the parameters inside are not recorded): a what-if note
    says so, with the buckets' count; at the profiled count, or with the parameters recorded, nothing is said."""
    bucketed = ZeroInfo(optimizer="AdamW", world_size=2, owners=[0, 1], nbytes=[10 * MB, 10 * MB])
    (note,) = even_share_note(bucketed, [2, 4, 8])
    assert note.startswith("--workers 4,8: ZeroRedundancyOptimizer broadcast one bucket per owner (2 of 20.0 MB")
    assert not even_share_note(bucketed, [2]) and not even_share_note(None, [4])
    assert not even_share_note(ZeroInfo(optimizer="AdamW", world_size=2, owners=[0, 0, 1], nbytes=[8, 1, 8]), [4])
    assert not even_share_note(ZeroInfo(optimizer="AdamW", world_size=2), [4])  # no broadcast listed: nothing guessed


def test_more_workers_shrink_each_ranks_optimizer_step(graph):
    zero = graph.meta.zero
    was, now = shard_bytes(zero, 2), shard_bytes(zero, 4)
    out = scale_workers(graph, 4)
    for r in range(4):
        before = graph.dur[(graph.kind == Kind.UPDATE) & (graph.rank == r % 2)].sum()
        after = out.dur[(out.kind == Kind.UPDATE) & (out.rank == r)].sum()
        assert after == pytest.approx(before * now[r] / was[r % 2], rel=1e-9)
    assert zero_comms(out).size == zero_comms(graph).size  # every parameter still broadcast once a step
    folded = scale_workers(graph, 100, replicate=False)  # 2 ranks stand for 100: the largest shard among each's copies
    big = shard_bytes(zero, 100)
    for r in range(2):
        before = graph.dur[(graph.kind == Kind.UPDATE) & (graph.rank == r)].sum()
        after = folded.dur[(folded.kind == Kind.UPDATE) & (folded.rank == r)].sum()
        assert after == pytest.approx(before * max(big[r::2]) / was[r], rel=1e-9)


def test_broadcast_factor_is_gloos_tree_per_rank_count():
    """gloo's binomial tree, its sends issued at once (``broadcast_sends``: the last rank's time in whole-buffer sends
    over one port) against the ring all-reduce's 2 (N-1)/N: 1 on 2 ranks, 1.5 on 3, 2 on 4 (the testbed measured
    0.88-0.94, 1.42-1.46 and 1.85-1.94 from 2 MB, ``bench/bcast_sweep.py``); NCCL's not measured: an all-reduce's."""
    assert [broadcast_sends(n) for n in (1, 2, 3, 4, 5, 8)] == [0, 1, 2, 3, 4, 6]
    assert [broadcast_factor(n) for n in (1, 2, 3, 4)] == [1.0, 1.0, 1.5, 2.0]
    assert broadcast_factor(8) == pytest.approx(6 * 8 / 14)
    assert broadcast_factor(4, "nccl") == 1.0


def test_zero_broadcasts_are_broadcasts_and_ddp_buckets_all_reduces(graph):
    """The reader sets each collective's kind (``CommKind``): ZeRO's parameter broadcasts and DDP's buckets."""
    comm = (graph.kind == Kind.COMM) & (graph.rank < 0)
    assert set(graph.comm_kind[zero_comms(graph)].tolist()) == {CommKind.BROADCAST}
    assert set(graph.comm_kind[comm & (graph.bucket >= 0)].tolist()) == {CommKind.ALL_REDUCE}


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_workers_price_the_broadcasts_as_gloos_tree(graph, workers):
    """``--workers N`` prices each ZeRO broadcast as the ring all-reduce of ``broadcast_factor(N)`` times its bytes on
    the N-rank link; on 4 ranks that is twice an all-reduce of its bytes (before: priced as one)."""
    out = scale_workers(graph, workers)
    topo = current_topology(out)
    comms = zero_comms(out)
    assert topo.world_size == workers and comms.size
    for v in comms.tolist():
        assert out.dur[v] == pytest.approx(allreduce_us(float(out.nbytes[v]) * broadcast_factor(workers), topo), rel=1e-9)
    if workers == 4:
        plain = np.array([allreduce_us(float(out.nbytes[v]), topo) for v in comms.tolist()])
        assert out.dur[comms].sum() == pytest.approx(2.0 * plain.sum(), rel=1e-9)


def test_optimizer_state_is_the_largest_shards(graph):
    zero = graph.meta.zero
    assert zero_state_share(graph) == pytest.approx(max(shard_bytes(zero, 2)) / sum(zero.nbytes))
    assert 0.4 < zero_state_share(graph) < 0.7


def test_data_parallel_fsdp_is_refused(graph):
    with pytest.raises(DagprofError, match="ZeroRedundancyOptimizer"):
        to_data_parallel(graph, "fsdp")


def test_hooks_only_profile_says_the_broadcasts_are_unseen():
    run = read_run(ZERO / "hooks")
    said = " ".join(str(w) for t in run.ranks for w in t.meta.warnings)
    assert "parameter broadcasts a step" in said and "not seen without Kineto" in said
    g = build_graph(run)
    assert g.meta.zero is not None and zero_comms(g).size == 0


@pytest.mark.parametrize("damage", [
    lambda z: z.update(owners=z["owners"][:-1]),  # a broadcast without its owner
    lambda z: z.update(owners=[5] + z["owners"][1:]),  # an owner outside the optimizer's group
    lambda z: z.update(world_size=8),  # a group larger than the job
])
def test_a_damaged_zero_record_is_refused_in_one_line(tmp_path, damage):
    """It read before as it came: sizes paired with the wrong broadcasts, shards priced for ranks that never were."""
    run = tmp_path / "run"
    shutil.copytree(os.path.join(DATA, "zero1", "hooks"), run)
    doc = json.loads((run / "rank0.json").read_text())
    damage(doc["zero"])
    (run / "rank0.json").write_text(json.dumps(doc))
    with pytest.raises(DagprofError, match=r"rank0\.json: ZeroRedundancyOptimizer record lists .* a damaged file"):
        open_run(str(run))
