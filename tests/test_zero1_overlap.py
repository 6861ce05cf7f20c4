"""ZeRO-1 overlapped with DDP's backward (``ZeroRedundancyOptimizer(overlap_with_ddp=True)`` stepped by
``hook_with_zero_step``) on its real recordings (tests/data/zero1/overlap*, made from bench/ddp_fresh/zero1_overlap.py):
each bucket's all-reduce -> its owner's local step -> the bucket's broadcast -> the wait for every broadcast, inside
backward; the replay of the measured run; a slower link re-pricing the all-reduces and broadcasts; ``--workers``
(which would move buckets to other owners) and a window holding ZeRO's warm-up iterations refused in one line."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

from dagprof.align.matching import match_collectives
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.pipeline import open_run
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import CommRole, Kind
from dagprof.traces.zero_run import ZERO_AR_WAIT, ZERO_BCAST_WAIT, ZERO_STEP, zero_name

RUN = DATA / "zero1" / "overlap"


@pytest.fixture(scope="module")
def graph():
    return build_graph(read_run(RUN))


def broadcasts(g, step: int | None = None) -> list[int]:
    """The shared transfers of ZeRO's parameter broadcasts (``CommRole.ZERO_PARAMS``)."""
    return np.flatnonzero((g.role == CommRole.ZERO_PARAMS) & (g.rank < 0) & (g.kind == Kind.COMM) & (step is None or g.step == step)).tolist()


def named(g, prefix: str, rank: int | None = None, step: int | None = None) -> list[int]:
    """Nodes whose name (without a rank's "rankR." prefix) starts with ``prefix``."""
    return [v for v in range(len(g)) if g.node_name(v).removeprefix(f"rank{g.rank[v]}.").startswith(prefix)
            and (rank is None or g.rank[v] == rank) and (step is None or g.step[v] == step)]


def upstream(g, v: int) -> set[int]:
    """Every node ``v`` waits for, through the graph's dependencies."""
    seen, todo = set(), [v]
    while todo:
        for u in g.predecessors(todo.pop()).tolist():
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


def test_each_owner_steps_its_buckets_after_their_all_reduce(graph):
    """The rank file lists the buckets' owners (``hook_with_zero_step``: bucket i to rank i mod 2); each step, each rank
    steps exactly the buckets it owns, each after a wait that the bucket's shared all-reduce releases."""
    zero = graph.meta.zero
    assert zero.buckets == [0, 1, 2, 3] and zero.owners == [0, 1, 0, 1] and zero.optimizer == "AdamW"
    assert graph.meta.comm_hook == "hook_with_zero_step(allreduce_hook)"
    for s in graph.meta.steps:
        for r in range(2):
            steps = named(graph, ZERO_STEP, r, s)
            assert sorted(int(graph.node_name(v).rsplit(" ", 1)[1]) for v in steps) == [b for b, o in zip(zero.buckets, zero.owners) if o == r]
            assert all(graph.kind[v] == Kind.UPDATE for v in steps)
            for v in steps:
                b = graph.node_name(v).rsplit(" ", 1)[1]
                wait = [u for u in graph.predecessors(v).tolist() if graph.node_name(u).endswith(f"{ZERO_AR_WAIT}{b}")]
                assert wait, graph.node_name(v)
                released = [graph.node_name(u) for u in graph.predecessors(wait[0]).tolist() if graph.rank[u] < 0 and graph.kind[u] == Kind.COMM]
                assert released == [f"allreduce bucket {b}.{released[0].rsplit('.', 1)[1]}"]


def test_broadcasts_follow_the_owners_step_and_the_wait_holds_them_all(graph):
    """One broadcast per bucket a step, sized as the bucket's parameters, issued on every rank after the owner's step of
    it; every rank's wait for the broadcasts depends on all of them (a root on its own join), and the next step's forward comes after that wait."""
    zero = graph.meta.zero
    for s in graph.meta.steps:
        comms = broadcasts(graph, s)
        assert sorted(int(graph.nbytes[v]) for v in comms) == sorted(zero.nbytes)
        for r in range(2):
            (wait,) = named(graph, ZERO_BCAST_WAIT, r, s)
            before = upstream(graph, wait)
            own = {graph.node_name(u) for u in before if graph.node_name(u).startswith(f"rank{r} sync.")}
            assert all(c in before or f"rank{r} sync.{graph.node_name(c)}" in own for c in comms)  # a root done first: its own join
            owner_steps = named(graph, ZERO_STEP, zero.owners[0], s)
            first = [v for v in comms if graph.node_name(v).startswith(f"{zero_name(zero.owners[0])}.")]
            assert any(u in upstream(graph, c) for c in first for u in owner_steps)  # bucket 0's broadcast after its step
            later = [v for v in range(len(graph)) if graph.rank[v] == r and graph.step[v] == s + 1 and graph.kind[v] == Kind.FORWARD]
            if later:
                assert wait in upstream(graph, later[0])


def test_replay_matches_and_a_slower_link_reprices_both_collectives():
    p = open_run(str(RUN))
    assert abs(p.analysis.error_pct) < 0.5
    g = p.graph
    res = evaluate(g, [Scenario(bandwidth="20Mbit"), Scenario(bandwidth="10Mbit")], tolerance_pct=None)
    fast, slow = (s.predicted_iter_ms for s in res["scenarios"])
    wire_ms = sum(g.meta.zero.nbytes) * 8 / 10e6 * 1e3  # the broadcasts alone at 10 Mbit/s: all-reduces add as much again
    assert slow - fast > 0.5 * wire_ms


def test_more_workers_are_refused_in_one_line(graph):
    with pytest.raises(DagprofError, match=r"--workers: ZeroRedundancyOptimizer\(overlap_with_ddp=True\) .* not modelled"):
        evaluate(graph, [Scenario(workers=4)], tolerance_pct=None)
    with pytest.raises(DagprofError, match="own DDP comm hook"):
        evaluate(graph, [Scenario(bucket_mb=1.0)], tolerance_pct=None)


def test_a_window_over_zeros_warm_up_is_refused():
    """ZeRO's first iterations step nothing (DDP's buckets are not final): their time is no training step's."""
    with pytest.raises(DagprofError, match=r"broadcast 0 of its 4 buckets in profiled step 1 .* profile later steps"):
        read_run(DATA / "zero1" / "overlap-warmup")


def test_the_steps_are_whole_iterations():
    """Steps are marked at DDP's forwards (the loop calls no ``step()``): each profiled step holds one forward pass of
    every layer, one backward, and ZeRO's work inside it."""
    run = read_run(RUN)
    for t in run.ranks:
        ev = t.events
        counts = set()
        for s in t.meta.steps_profiled:
            names = [ev.name_of(i) for i in np.flatnonzero((ev.step == s) & (ev.depth == 0))]
            assert names.count("tok forward") == 1 and names.count("tok backward") == 1  # the embedding: first in, last out
            assert names.count(ZERO_BCAST_WAIT) == 1 and names.index("tok forward") < names.index(ZERO_BCAST_WAIT)
            counts.add(int(np.count_nonzero((ev.step == s) & (ev.kind == Kind.FORWARD) & (ev.depth == 0))))
        assert len(counts) == 1


def test_a_root_done_before_its_receivers_is_released_alone(graph):
    """The root's completion is its sends handed over; the exchange ends with the receivers': a root that was done first
    waits on its own join (kept as measured), not on the shared broadcast, whose successors are the receivers'."""
    released = 0
    for v in broadcasts(graph):
        name = graph.node_name(v)
        (root,) = [o for o in set(graph.meta.zero.owners) if name.startswith(f"{zero_name(o)}.")]
        after = {int(graph.rank[u]) for u in graph.successors(v).tolist()}
        assert after  # someone always waits on the exchange itself
        if root not in after:
            (own,) = [u for u in range(len(graph)) if graph.node_name(u) == f"rank{root} sync.{name}"]
            assert [graph.node_name(u) for u in graph.successors(own).tolist()] == [f"rank{root}.{ZERO_BCAST_WAIT}"]
            released += 1
    assert released


@pytest.mark.parametrize("folder", ["overlap", "kineto"])
def test_each_broadcast_instance_carries_its_owner_as_root(folder):
    """The collector records each ZeRO broadcast's owner; the instance every rank joined carries it as its root (the
    rank file's owner list, in order), and no other collective gets one."""
    run = read_run(DATA / "zero1" / folder)
    matching = match_collectives(run)
    zero = run.ranks[0].meta.zero
    ev = run.ranks[0].events
    ours = {int(matching.instance[0][i]) for i in np.flatnonzero((ev.kind == Kind.COMM) & (ev.role == CommRole.ZERO_PARAMS))}
    roots = [it.root for k, it in enumerate(matching.instances) if k in ours]
    assert roots and set(roots) == set(zero.owners)
    assert all(it.name == zero_name(it.root) for k, it in enumerate(matching.instances) if k in ours)
    assert all(it.root == -1 for k, it in enumerate(matching.instances) if k not in ours)
