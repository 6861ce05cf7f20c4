import numpy as np
import pytest

from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.replay import replay
from dagprof.traces.events import Kind

from synthetic import ddp_run


def predicted_iter(g, res, rank):
    marks = np.flatnonzero((g.kind == Kind.STEP) & (g.rank == rank))
    return (res.start[marks].max() - res.start[marks].min()) / len(g.meta.steps)


@pytest.mark.parametrize("slow", [None, {1: 1.5}, {0: 2.0}])
def test_replay_of_measured_config_is_exact(slow):
    g = build_graph(ddp_run(ranks=2, slow=slow))
    res = replay(g)
    for r in (0, 1):
        assert predicted_iter(g, res, r) == pytest.approx(g.meta.measured_iter_us[r], rel=1e-9)


def test_collective_joins_all_ranks_and_waits_for_slowest():
    g = build_graph(ddp_run(ranks=3, steps=1, slow={2: 3.0}))
    res = replay(g)
    syncs = np.flatnonzero(g.kind == Kind.SYNC)
    comms = np.flatnonzero(g.kind == Kind.COMM)
    assert len(syncs) == len(comms) == 2  # two buckets, one step
    for s in syncs:
        preds = g.predecessors(s)
        assert sorted(g.rank[preds].tolist()) == [0, 1, 2]  # one ready point per rank
        assert g.rank[res.gate[s]] == 2  # the slow rank gates the collective
    assert np.all(g.rank[comms] == -1)


def test_graph_structure_chain_and_markers():
    g = build_graph(ddp_run(ranks=1, steps=2, layers=3, buckets=((2, 1, 0),)))
    marks = np.flatnonzero(g.kind == Kind.STEP)
    assert len(marks) == 3  # two steps: two starts and the closing boundary
    fw = np.flatnonzero(g.kind == Kind.FORWARD)
    assert [g.layers[l] for l in g.layer[fw[:3]]] == ["layer0", "layer1", "layer2"]
    waits = np.flatnonzero(g.kind == Kind.COMM_WAIT)
    assert np.all(g.dur[waits] == 0)  # waits cost nothing of their own


def test_more_comm_time_slows_iteration():
    g = build_graph(ddp_run(ranks=2, comm_us=15))
    slower = g.replace(dur=np.where(g.kind == Kind.COMM, g.dur * 10, g.dur))
    assert replay(slower).makespan > replay(g).makespan


def test_steps_outside_trace_is_clear_error():
    with pytest.raises(DagprofError, match="requested but the trace holds steps 0..2"):
        build_graph(ddp_run(steps=3), steps=range(50, 60))


def test_queued_collective_spans_give_transfer_times():
    """Hook-style spans run from issue to completion, so a bucket issued while the previous one is
    still on the link records its queueing too; the graph must hold the transfer alone."""
    run = ddp_run(ranks=2, steps=2, bw_us=1.0, comm_us=15.0, buckets=((3,), (2,), (1,), (0,)))
    spans = run.ranks[0].events.dur[run.ranks[0].events.kind == Kind.COMM]
    assert spans.max() > 20.0  # queued behind earlier buckets
    g = build_graph(run)
    assert np.allclose(g.dur[g.kind == Kind.COMM], 15.0)
    from dagprof.passes.link_fit import fit_topology

    link = fit_topology(g).inter  # one message size: all of it is bandwidth, 2(N-1)/N = 1 for two ranks
    assert link.beta_us_per_byte == pytest.approx(15.0 / 4096)


def test_consuming_build_gives_the_same_graph_and_spends_the_builder():
    """``GraphBuilder.build(consume=True)`` (a builder that is done frees its columns as it copies them) builds the graph
    ``build()`` does, column by column and edge by edge; the spent builder refuses to be used again."""
    from dagprof.graph.dag import NODE_COLUMNS, GraphBuilder

    g = build_graph(ddp_run())
    keep = np.ones(len(g), dtype=bool)
    keep[::5] = False
    kept = GraphBuilder.from_graph(g, keep)[0].build()
    b = GraphBuilder.from_graph(g, keep)[0]
    spent = b.build(consume=True)
    for c in (*NODE_COLUMNS, "indptr", "succ"):
        x, y = getattr(kept, c), getattr(spent, c)
        assert x.dtype == y.dtype and np.array_equal(x, y), c
    for use in (lambda: b.add_node("x", Kind.FORWARD), lambda: len(b), b.build):
        with pytest.raises(RuntimeError, match="spent by build"):
            use()
