"""An FSDP call whose enqueue the build cut in pieces (a join leaving it inside: ``graph.pieces``; a transfer that starts
before its call returns) is one call to the passes that regroup or drop collectives: ``--mesh`` refused such a run ("has no
collective behind its wait"), and a dropped call left its first piece behind. In tests/data/review6/moe-routers every
transfer starts the nanosecond its call ends (10 of 96 a fraction of a nanosecond before it, by float rounding, which cut
them until ``graph.pieces`` took an instant that close for the call's end); the tests move them inside their calls."""
from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
from testdata import DATA

from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import check_fsdp_edges, fsdp_collectives, issuers
from dagprof.passes.fsdp_mesh import set_mesh
from dagprof.passes.fsdp_units import is_cut_piece, merge_units
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import TIME_RESOLUTION_US, Kind

MOE = DATA / "review6" / "moe-routers"


def enqueues(g) -> list[int]:
    return [int(e) for e in np.flatnonzero((g.kind == Kind.COMM_ENQUEUE) & (g.rank >= 0)) if ".fsdp " in g.node_name(int(e))]


def cut(g) -> list[int]:
    """The enqueue pieces that a later piece of the same call follows."""
    return [e for e in enqueues(g) if any(is_cut_piece(g, e, int(v)) for v in g.successors(e).tolist())]


def assert_whole_calls(g) -> None:
    """Every FSDP enqueue is its call's last piece, followed by its wait, or a piece cut before it."""
    for e in enqueues(g):
        r, after = int(g.rank[e]), g.successors(e).tolist()
        assert any(g.kind[v] == Kind.COMM_WAIT and int(g.rank[v]) == r for v in after) or any(is_cut_piece(g, e, int(v)) for v in after), g.node_name(e)


def transfers_inside(run, us: float = 0.01):
    """``run`` with each transfer that starts the instant its enqueue call ends opened ``us`` earlier, inside the call (its
    end kept), as gloo's runloop does when it takes the work before the call returns."""
    for i, t in enumerate(run.ranks):
        ev, s, d = t.events, t.flows[:, 0], t.flows[:, 1]
        at_end = d[(ev.kind[s] == Kind.COMM_ENQUEUE) & (ev.kind[d] == Kind.COMM) & (np.abs(ev.start[d] - ev.end[s]) < TIME_RESOLUTION_US)]
        start, dur = ev.start.copy(), ev.dur.copy()
        start[at_end] -= us
        dur[at_end] += us
        run.ranks[i] = dataclasses.replace(t, events=dataclasses.replace(ev, start=start, dur=dur))
    return run


def test_a_rounding_cuts_no_call():
    g = build_graph(read_run(MOE))
    assert not cut(g)
    assert not np.any((g.dur > 0) & (g.dur < TIME_RESOLUTION_US))  # no sub-nanosecond piece of a call as a node


def test_a_transfer_inside_its_call_cuts_it():
    assert len(cut(build_graph(transfers_inside(read_run(MOE))))) == 96  # every FSDP call: 24 a step, 2 steps, 2 ranks


def test_mesh_regroups_cut_calls_whole():
    g = build_graph(transfers_inside(read_run(MOE)))
    calls = sum(len(issuers(g, c.node)) for c in fsdp_collectives(g))
    for mesh in ((1, 4), (2, 2)):
        m = set_mesh(g, *mesh)
        assert_whole_calls(m)
        check_fsdp_edges(m)
        assert len(cut(m)) == 2 * len(cut(g))  # rank r copies rank r mod 2, pieces and all
        assert sum(len(issuers(m, c.node)) for c in fsdp_collectives(m)) == 2 * calls


def test_a_one_replica_meshs_all_reduces_are_regrouped_not_doubled():
    """The profile is 1x2 on a 2-D mesh: FSDP2 all-reduces each reduce-scattered shard on one rank, as the recorded 2x2 run
    of the same script (a 4-rank run of bench/review6/hsdp_moe.py, not vendored: per step 10 all-gathers and 7 reduce-scatters a shard group, 7
    all-reduces a replicate group) does on two."""
    g = build_graph(read_run(MOE))
    m = set_mesh(g, 2, 2)
    groups = Counter((c.kind.label, tuple(sorted(issuers(m, c.node)))) for c in fsdp_collectives(m))
    steps = len(g.meta.steps)
    assert groups == {("all_gather", (0, 1)): 10 * steps, ("all_gather", (2, 3)): 10 * steps, ("reduce_scatter", (0, 1)): 7 * steps,
                      ("reduce_scatter", (2, 3)): 7 * steps, ("all_reduce", (0, 2)): 7 * steps, ("all_reduce", (1, 3)): 7 * steps}


def test_merging_units_drops_cut_calls_whole():
    g = build_graph(transfers_inside(read_run(MOE)))
    m = merge_units(g, "merge:all")
    assert_whole_calls(m)
    assert len(fsdp_collectives(m)) < len(fsdp_collectives(g))
