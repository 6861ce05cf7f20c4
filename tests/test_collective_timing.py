"""How a collective several ranks recorded is timed in the global graph (graph/shared_collectives.py).

Hand-built 2-rank traces isolate each measured effect seen on real gloo, TF and JAX runs: a rank
that sees the completion late (exit lag), an enqueue call that returns after its transfer started,
a worker thread that closes its span after it released the waiting thread, two collectives in flight
that complete out of order, a skewed clock. In each, the replay of the measured configuration must
reproduce every rank's iteration and contradict no inferred edge. The real 2-worker TF/JAX fixtures
and a real gloo DDP run are held to the same.
"""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis import analyze
from dagprof.graph.build import build_graph
from dagprof.graph.provenance import violations
from dagprof.pipeline import open_run
from dagprof.traces.events import CommKind, EventTable, Kind, Lane, LaneKind, RankTrace, Run
from dagprof.traces.meta import Collectives, RankMeta

MS = 1000.0  # us


def rank_trace(rank: int, colls: list[tuple[float, float, float, float, int]], wait: tuple[float, float], step_end: float,
               base_ns: int = 0, world: int = 2, kinds: tuple[str, ...] = ()) -> RankTrace:
    """One step: compute, a collective enqueued per entry of ``colls`` = (enqueue start, enqueue end,
    transfer start, transfer end, comm lane), backward between enqueues, a wait for all, an update.
    ``kinds``: each collective's canonical name (default all-reduce)."""
    rows = []  # name, kind, lane, start, end, seq

    def add(name, kind, lane, a, z, seq=-1):
        rows.append((name, kind, lane, a, z, seq))
        return len(rows) - 1

    add("ProfilerStep#0", Kind.STEP, 0, 0.0, step_end)
    t = 0.0
    flows = []
    for k, (e0, e1, x0, x1, lane) in enumerate(colls):
        add(f"bw{k}", Kind.BACKWARD if k else Kind.FORWARD, 0, t, e0)
        enq = add("c10d::allreduce_", Kind.COMM_ENQUEUE, 0, e0, e1)
        flows.append((enq, add("gloo:all_reduce", Kind.COMM, lane, x0, x1, seq=k)))
        t = e1
    add("bw_last", Kind.BACKWARD, 0, t, wait[0])
    w = add("wait", Kind.COMM_WAIT, 0, *wait)
    add("update", Kind.UPDATE, 0, wait[1], step_end)
    flows += [(x, w) for _, x in flows]
    names = sorted({r[0] for r in rows})
    cols = list(zip(*rows))
    seq = np.array(cols[5])
    table = EventTable.from_columns(
        names, name=[names.index(n) for n in cols[0]], kind=cols[1], lane=cols[2], start=cols[3],
        dur=np.subtract(cols[4], cols[3]), depth=[-1 if k == Kind.STEP else 0 for k in cols[1]], step=np.zeros(len(rows)),
        group=np.where(seq >= 0, 0, -1), seq=seq, nbytes=np.where(seq >= 0, 4096, 0),
    )
    lanes = [Lane("main", LaneKind.CPU_THREAD, main=True), Lane("gloo 1", LaneKind.COMM_THREAD), Lane("gloo 2", LaneKind.COMM_THREAD)]
    transfers = [x for _, x in flows[:len(colls)]]
    names = list(kinds) or [CommKind.ALL_REDUCE] * len(colls)
    return RankTrace(rank=rank, world_size=world, source=f"synthetic/rank{rank}", events=table, lanes=lanes, base_ns=base_ns,
                     groups=["0"], flows=np.array(flows, dtype=np.int64), backend="gloo",
                     meta=RankMeta(collectives=Collectives(event=transfers, kind=names, dtype=["float32"] * len(colls))))


def per_rank_error(run: Run):
    g = build_graph(run)
    a = analyze(g)
    return g, {r: a.predicted_iter_us[r] - a.measured_iter_us[r] for r in a.measured_iter_us}


def assert_exact(run: Run):
    g, err = per_rank_error(run)
    assert all(abs(e) < 1e-6 for e in err.values()), err
    assert not [c for c in violations(g) if c.violated], violations(g)
    return g


def shared_comms(g):
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    return comm[np.argsort([g.node_name(c) for c in comm])]


# Rank 0 reaches each bucket late and its peer, waiting since long, exchanges at once; three buckets
# on one comm thread per rank, so clock alignment (the median of matched ends) sees the ranks agree.
LATE = [(10 * MS, 10.1 * MS, 10.1 * MS, 10.5 * MS, 1), (20 * MS, 20.1 * MS, 20.1 * MS, 20.5 * MS, 1), (30 * MS, 30.1 * MS, 30.1 * MS, 30.5 * MS, 1)]
EARLY = [(2 * MS, 2.1 * MS, 2.1 * MS, 10.5 * MS, 1), (3 * MS, 3.1 * MS, 10.5 * MS, 20.5 * MS, 1), (4 * MS, 4.1 * MS, 20.5 * MS, 30.5 * MS, 1)]


def test_a_rank_that_sees_the_completion_late_keeps_its_lag():
    """Rank 1 sees the last exchange complete 3 ms after rank 0 did (a descheduled thread): the shared
    collective ends at the first completion and rank 1's lag becomes its own overhead."""
    early = EARLY[:2] + [(4 * MS, 4.1 * MS, 20.5 * MS, 33.5 * MS, 1)]
    run = Run([rank_trace(0, LATE, (31 * MS, 31.2 * MS), 32 * MS), rank_trace(1, early, (5 * MS, 34 * MS), 35 * MS)], "synthetic")
    g = assert_exact(run)
    last = shared_comms(g)[-1]
    assert g.dur[last] == pytest.approx(0.4 * MS)  # from the last rank's join to the first completion
    assert g.gap[last] == pytest.approx(0.0)


def test_an_enqueue_that_returns_after_its_transfer_started_binds_at_the_transfer_start():
    """Rank 0's enqueue call returns 2 ms after its transfer ended (the main thread lost the core
    after handing the work over): the collective did not wait for the call to return."""
    late = LATE[:2] + [(30 * MS, 32.5 * MS, 30.1 * MS, 30.5 * MS, 1)]
    run = Run([rank_trace(0, late, (32.5 * MS, 32.6 * MS), 33 * MS), rank_trace(1, EARLY, (5 * MS, 30.6 * MS), 31 * MS)], "synthetic")
    g = assert_exact(run)
    assert g.dur[shared_comms(g)[-1]] == pytest.approx(0.4 * MS)


def test_a_waiter_released_before_the_transfer_span_closed_bounds_the_completion():
    """Rank 1's wait returned at 31 ms but its worker thread closed the transfer span at 33 ms (it woke
    the waiter first): the exchange completed by 31 ms on rank 1's clock."""
    early = EARLY[:2] + [(4 * MS, 4.1 * MS, 20.5 * MS, 33 * MS, 1)]
    run = Run([rank_trace(0, LATE, (31 * MS, 31.2 * MS), 32 * MS), rank_trace(1, early, (5 * MS, 31 * MS), 32 * MS)], "synthetic")
    assert_exact(run)


def test_collectives_that_complete_out_of_order_replay_where_they_completed():
    """Two buckets on gloo's two worker threads: the second, smaller one completes first. The channel
    takes them in the order their joins released them, and the one that completed first costs nothing."""
    late = [(10 * MS, 10.1 * MS, 10.1 * MS, 12 * MS, 1), (10.2 * MS, 10.3 * MS, 10.3 * MS, 11 * MS, 2)]
    early = [(2 * MS, 2.1 * MS, 2.1 * MS, 12 * MS, 1), (3 * MS, 3.1 * MS, 3.1 * MS, 11 * MS, 2)]
    run = Run([rank_trace(0, late, (10.4 * MS, 12.1 * MS), 13 * MS), rank_trace(1, early, (4 * MS, 12.1 * MS), 13 * MS)], "synthetic")
    g = assert_exact(run)
    first, second = shared_comms(g)
    assert g.dur[first] + g.gap[first] == pytest.approx(1.9 * MS) and g.dur[second] == 0.0


def test_timing_is_read_on_the_aligned_clock():
    """Rank 1's clock runs 37 ms ahead: aligned first, the graph is the same as with true clocks."""
    early = EARLY[:2] + [(4 * MS, 4.1 * MS, 20.5 * MS, 33.5 * MS, 1)]
    skew = 37_000_000

    def ranks(shift_ns: int) -> Run:
        r1 = rank_trace(1, early, (5 * MS, 34 * MS), 35 * MS, base_ns=shift_ns)
        return Run([rank_trace(0, LATE, (31 * MS, 31.2 * MS), 32 * MS), r1], "synthetic")

    true, skewed = build_graph(ranks(0)), build_graph(ranks(skew))
    assert np.allclose(true.dur, skewed.dur) and np.allclose(true.gap, skewed.gap, atol=1e-3)
    assert_exact(ranks(skew))


def test_a_broadcast_receiver_released_before_the_last_rank_joined_waits_only_for_those_that_had():
    """Three ranks, gloo's one-to-all broadcast from rank 0: rank 2 gets its data as soon as the root sent
    it, 4 ms before rank 1 joins; the root completes once rank 1 did. Rank 2 must not wait for rank 1."""
    buckets = [(t * MS, (t + 0.1) * MS, (t + 0.1) * MS, (t + 0.5) * MS, 1) for t in (1, 2, 3)]  # ranks agree: clocks align
    kinds = (CommKind.ALL_REDUCE,) * 3 + (CommKind.BROADCAST,)
    ranks = [rank_trace(0, buckets + [(4 * MS, 4.1 * MS, 4.1 * MS, 9.2 * MS, 1)], (4.2 * MS, 9.3 * MS), 10 * MS, world=3, kinds=kinds),
             rank_trace(1, buckets + [(9 * MS, 9.05 * MS, 9.05 * MS, 9.2 * MS, 1)], (9.1 * MS, 9.3 * MS), 10 * MS, world=3, kinds=kinds),
             rank_trace(2, buckets + [(5 * MS, 5.1 * MS, 5.1 * MS, 5.3 * MS, 1)], (5.2 * MS, 5.4 * MS), 6 * MS, world=3, kinds=kinds)]
    g = assert_exact(Run(ranks, "synthetic"))
    own = [v for v in range(len(g)) if g.kind[v] == Kind.SYNC and g.node_name(v).startswith("rank2 sync.")]
    assert len(own) == 1 and sorted(g.rank[g.predecessors(own[0])].tolist()) == [0, 2]  # the root and itself


@pytest.mark.parametrize("name", ["tf/loop", "tf/fit", "tf-jax/mlp"])
def test_real_tf_and_jax_runs_replay_their_measured_iteration(name):
    """Real 2-worker TF (gRPC ring) and JAX (gloo) recordings, made under load: workers left the same
    collective milliseconds apart. Every rank's iteration replays as measured, no edge contradicted."""
    prof = open_run(DATA / name)
    a = prof.analysis
    for r, measured in a.measured_iter_us.items():
        assert a.predicted_iter_us[r] == pytest.approx(measured, rel=1e-3), (name, r)
    assert not [c for c in violations(prof.graph) if c.violated]


def test_real_gloo_ddp_run_replays_its_measured_iteration(small_ddp_run):
    """A real 2-rank gloo DDP run recorded here: buffer broadcasts at every step start and bucket
    all-reduces on gloo's two worker threads. Each rank's replayed iteration within 1 %."""
    a = open_run(small_ddp_run).analysis
    for r, measured in a.measured_iter_us.items():
        assert abs(a.predicted_iter_us[r] / measured - 1) < 0.01, (r, a.predicted_iter_us[r], measured)
