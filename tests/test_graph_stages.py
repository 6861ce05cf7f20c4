"""The graph builder's stages (select -> anchors -> pieces -> nodes and edges) and the provenance it records.

On the excerpt of ``.item()`` on a GPU (HolisticTraceAnalysis' cuda_event_sync trace): the host op
``aten::is_nonzero`` holds ``aten::item`` > ``cudaMemcpyAsync`` (D2H into pageable memory) and
``cudaStreamSynchronize``; the builder must cut it at the copy call's start (launch), around the call
(a wait on the copy) and around the sync (a wait on the stream's last op).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from dagprof.graph import build
from dagprof.graph.measured import GraphRule, rule_name
from dagprof.graph.pieces import anchors, pieces, select
from dagprof.graph.provenance import provenance, violations
from dagprof.replay import replay
from dagprof.traces.events import TIME_RESOLUTION_US, Dep, Kind, Run
from dagprof.traces.kineto import read_kineto

from synthetic import ddp_run

PATH = os.path.join(os.path.dirname(__file__), "data", "kineto_excerpts", "hta_cuda_event_sync.json.gz")


@pytest.fixture(scope="module")
def trace():
    return read_kineto(PATH)


def row(t, name: str) -> int:
    ev = t.events
    return next(i for i in range(len(ev)) if ev.name_of(i) == name)


def test_select_takes_depth0_ops_of_the_chosen_steps(trace):
    sel = select(trace, [100], np.full(len(trace.events), -1))
    ev = trace.events
    assert np.all(ev.depth[sel.node] == 0) and not np.any(ev.kind[sel.node] == Kind.STEP)
    assert not sel.shared.any() and sel.spans.tolist() == [[100.0, 0.0, 3154.0]]
    item = row(trace, "aten::item")
    assert ev.name_of(sel.owner[item]) == "aten::is_nonzero"  # the depth-0 op around it
    assert sel.owner[row(trace, "ProfilerStep#100")] == -1


def test_two_empty_ops_at_one_instant_are_two_owners(trace):
    """Two depth-0 ops that took no time at one instant each own themselves. The later one "enclosed" the earlier, whose
    flows then joined the later (a Horovod negotiation of 0 us, a rank's request ended as its response began, lost its
    requests to the copy-in after it, and with them its join: 9 negotiations of 7 of 50 Horovod runs, one left a 280 ms
    gap for the averaged model to spread over every step)."""
    ev = trace.events
    sel = select(trace, [100], np.full(len(ev), -1))
    on_lane = np.flatnonzero(sel.node & (ev.lane == ev.lane[np.flatnonzero(sel.node)[0]]))
    a, b = on_lane[np.argsort(ev.start[on_lane], kind="stable")][:2]
    start, dur = ev.start.copy(), ev.dur.copy()
    start[b], dur[a], dur[b] = start[a], 0.0, 0.0
    t = dataclasses.replace(trace, events=dataclasses.replace(ev, start=start, dur=dur))
    owner = select(t, [100], np.full(len(ev), -1)).owner
    assert owner[a] == a and owner[b] == b


def test_anchors_bind_launches_at_the_call_start_and_waits_over_the_call(trace):
    sel = select(trace, [100], np.full(len(trace.events), -1))
    anc = anchors(trace, sel)
    ev = trace.events
    call = row(trace, "cudaMemcpyAsync")
    launch = np.flatnonzero((anc.src == call) & (anc.rule == Dep.LAUNCH))
    assert anc.src_at[launch].tolist() == [ev.start[call]]
    copy_wait = np.flatnonzero((anc.dst == call) & (anc.rule == Dep.COPY))
    assert anc.dst_at[copy_wait].tolist() == [ev.start[call]] and anc.until[copy_wait].tolist() == [ev.end[call]]
    assert np.all(np.isnan(anc.until[anc.rule == Dep.LAUNCH]))  # a launch is not a wait


def test_pieces_cut_the_host_op_at_every_instant_a_flow_joins(trace):
    sel = select(trace, [100], np.full(len(trace.events), -1))
    anc = anchors(trace, sel)
    cut = pieces(trace, sel, anc, [100])
    ev = trace.events
    owner = row(trace, "aten::is_nonzero")
    mine = np.flatnonzero(cut.owner == owner)
    copy, sync = row(trace, "cudaMemcpyAsync"), row(trace, "cudaStreamSynchronize")
    bounds = sorted({*cut.start[mine].tolist(), *cut.end[mine].tolist()})
    assert bounds == [ev.start[owner], ev.start[copy], ev.end[copy], ev.start[sync], ev.end[sync], ev.end[owner]]
    waits = [(cut.start[k], cut.end[k], ev.name_of(cut.wait[k])) for k in mine if cut.wait[k] >= 0]
    assert waits == [(ev.start[copy], ev.end[copy], "cudaMemcpyAsync"), (ev.start[sync], ev.end[sync], "cudaStreamSynchronize")]
    assert np.all(np.diff(cut.start[cut.lane_at[0]:cut.lane_at[1]]) >= 0)  # sorted along each lane
    assert (cut.mark >= 0).sum() == 2  # the step's opening and closing marks


@pytest.mark.parametrize("before_end_ns", [0.4, 2.0])
def test_an_instant_less_than_a_nanosecond_from_an_ops_end_is_its_end(trace, before_end_ns):
    """A wait that ends a fraction of a nanosecond before the op around it (one instant, split by float rounding) leaves no
    sub-nanosecond piece: the op is not cut there. Two nanoseconds are two instants: the op is cut."""
    ev = trace.events
    owner, copy, sync = row(trace, "aten::is_nonzero"), row(trace, "cudaMemcpyAsync"), row(trace, "cudaStreamSynchronize")
    dur = ev.dur.copy()
    dur[sync] = ev.end[owner] - before_end_ns * TIME_RESOLUTION_US - ev.start[sync]
    t = dataclasses.replace(trace, events=dataclasses.replace(ev, dur=dur))
    sel = select(t, [100], np.full(len(ev), -1))
    cut = pieces(t, sel, anchors(t, sel), [100])
    mine = np.flatnonzero(cut.owner == owner)
    sync_end = [t.events.end[sync]] if before_end_ns >= 1 else []
    assert cut.end[mine].tolist() == [ev.start[copy], ev.end[copy], ev.start[sync], *sync_end, ev.end[owner]]
    assert ev.name_of(cut.wait[mine[3]]) == "cudaStreamSynchronize"  # the wait ends with the op, or 2 ns before it


def test_provenance_records_measured_times_and_rules(trace):
    g = build.build_graph(Run([trace], PATH))
    p = provenance(g)
    assert len(p.mstart) == len(g) and len(p.src) == g.num_edges
    rules = {rule_name(int(r)) for r in np.unique(p.rule)}
    assert rules >= {"LAUNCH", "COPY", "SYNC", "PROGRAM_ORDER", "WINDOW_END"}
    waits = np.flatnonzero(g.kind == Kind.COMM_WAIT)
    assert np.all(p.mstart[waits] == p.mend[waits])  # a wait's dependent instant is its end
    assert all(c.violated == 0 for c in violations(g))


def test_violations_count_edges_the_measurement_contradicts(trace):
    g = build.build_graph(Run([trace], PATH))
    p = provenance(g)
    late = int(np.argmax(p.mend))  # the latest op to end ...
    early = int(np.flatnonzero(g.kind != Kind.STEP)[0])  # ... cannot precede the first one
    bad = type(p)(p.mstart, p.mend, np.r_[p.src, late], np.r_[p.dst, early], np.r_[p.rule, int(Dep.AFTER)], np.r_[p.seen_end, p.mend[late]])
    checks = {c.rule: c for c in violations(g.replace(meta=g.meta.replace(provenance=bad)))}
    assert checks["AFTER"].violated == 1 and checks["AFTER"].worst_us == pytest.approx(p.mend[late] - p.mstart[early])


def test_every_lane_starts_after_the_first_mark_and_ends_before_the_last(trace):
    g = build.build_graph(Run([trace], PATH))
    p = provenance(g)
    start = p.src[p.rule == GraphRule.WINDOW_START]
    end = p.dst[p.rule == GraphRule.WINDOW_END]
    assert set(g.kind[start].tolist()) == {Kind.STEP} and set(g.kind[end].tolist()) == {Kind.STEP}
    res = replay(g)
    gpu = [v for v in range(len(g)) if g.devices[g.device[v]].name.endswith("stream 7")]
    assert res.start[gpu].min() >= res.start[start[0]]  # no lane runs before the step begins


def test_collectives_shared_by_ranks_and_one_no_peer_recorded():
    two = build.build_graph(ddp_run(ranks=2, steps=1))
    one = build.build_graph(ddp_run(ranks=1, steps=1, comm_us=15.0))
    for g in (two, one):
        comm = np.flatnonzero(g.kind == Kind.COMM)
        assert len(comm) == 2 and np.all(g.rank[comm] == -1)
    # alone, a collective keeps its measured span (waiting for absent peers included)
    ev = ddp_run(ranks=1, steps=1, comm_us=15.0).ranks[0].events
    assert sorted(one.dur[one.kind == Kind.COMM].tolist()) == sorted(ev.dur[ev.kind == Kind.COMM].tolist())
    p = provenance(one)
    assert np.all(np.isfinite(p.mstart[one.kind == Kind.COMM]))  # measured on the one rank's clock
    assert np.all(np.isnan(provenance(two).mstart[two.kind == Kind.COMM]))  # on no single clock
