"""gloo's ring at the scheduler's pace beyond the cores (``passes.ring_pace``): a JAX ``--workers N --cores C`` what-if
whose ranks' communication threads outnumber the cores waits at least each gloo call's ring steps at the pace.
Recording: ``tf-jax/shardmap-threads``."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dagprof.passes.comm_cpu import keep_comm_cpu, lane_cpu, off_lane_budget
from dagprof.passes.compute import ring_pace_note, share_cores
from dagprof.passes.ring_pace import TICK_US, pace_us, paced_us, ring_pace
from dagprof.passes.workers import scale_workers
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.events import Kind

RUN = "tests/data/tf-jax/shardmap-threads"


@pytest.fixture(scope="module")
def graph():
    return open_run(RUN).graph


def test_the_pace_applies_only_where_the_ranks_outnumber_the_cores(graph):
    """1 or 2 ranks on 2 cores fit them (a profile on those cores holds its own pace), 3 or 4 do not, each ring step then a
    quarter of the tick (the recorded host's). No pace for a TF or PyTorch job, or a JAX job whose arrays a step were not
    read."""
    assert ring_pace(graph, 1, 2) is None and ring_pace(graph, 2, 2) is None and ring_pace(graph, 3, 2) is not None
    assert pace_us(TICK_US, 2) == TICK_US / 4
    pace = ring_pace(graph, 4, 2)
    assert pace is not None and pace.ranks == 4 and pace.tick_recorded
    assert pace.tick_us == max(graph.meta.host_tick_us.values()) and 0 < pace.step_us <= pace.tick_us
    assert pace.step_us == pytest.approx(pace.tick_us / 4)
    assert ring_pace(graph.replace(meta=graph.meta.replace(framework="tensorflow")), 4, 2) is None
    assert ring_pace(graph.replace(meta=graph.meta.replace(framework=None)), 4, 2) is None  # a PyTorch job
    assert ring_pace(graph.replace(meta=graph.meta.replace(collective_operands_per_step=None)), 4, 2) is None
    unsaid = ring_pace(graph.replace(meta=graph.meta.replace(host_tick_us={})), 4, 2)
    assert unsaid.tick_us == TICK_US and not unsaid.tick_recorded


def _collectives(g):
    return np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))


def test_four_workers_on_two_cores_wait_at_least_their_ring_steps_at_the_pace(graph):
    """``--workers 4 --cores 2``: each collective and its wait for a core last at least its arrays x 6 ring steps x the
    pace, and where the pace binds the wait is exactly the rest (not added to the waits for a core)."""
    four = scale_workers(graph, 4)
    pace = ring_pace(four, 4, 2)
    comm = _collectives(four)
    floor = paced_us(four, comm, pace)
    arrays = graph.meta.collective_operands_per_step
    per_step = {int(s): int((four.step[comm] == s).sum()) for s in four.step[comm].tolist()}
    assert floor == pytest.approx([arrays / per_step[int(s)] * 6 * pace.step_us for s in four.step[comm].tolist()])
    slow = four.replace(meta=four.meta.replace(host_tick_us={h: 4 * t for h, t in four.meta.host_tick_us.items()}))
    for g, bound in ((four, floor), (slow, 4 * floor)):
        out = share_cores(g, 2, replayer=replay)
        names = [out.node_name(i) for i in range(len(out))]
        waited = {n.removesuffix(" (off-lane cpu waits for a core)"): float(out.gap[i]) for i, n in enumerate(names)
                  if n.endswith("waits for a core)")}
        for c, least in zip(comm.tolist(), bound.tolist()):
            assert float(g.dur[c]) + waited.get(g.node_name(c), 0.0) >= least - 1e-6
    # a 16 ms tick: the pace (4 ms a ring step, 5 arrays x 6 steps) outlasts every collective, and sets its wait
    out = share_cores(slow, 2, replayer=replay)
    names = [out.node_name(i) for i in range(len(out))]
    gaps = {n.removesuffix(" (off-lane cpu waits for a core)"): float(out.gap[i]) for i, n in enumerate(names) if n.endswith("waits for a core)")}
    assert all(4 * f > slow.dur[c] for c, f in zip(comm.tolist(), floor.tolist()))
    assert [gaps[slow.node_name(c)] for c in comm.tolist()] == pytest.approx((4 * floor - slow.dur[comm]).tolist())


def test_the_note_says_the_pace_where_it_applies(graph):
    """Said for 4 workers on 2 cores, with the tick and the threads; not without --cores or where the ranks fit the cores."""
    note = ring_pace_note(graph, 4, 2)
    assert note is not None and "4 ms" in note and "4 JAX ranks (2 gloo threads each)" in note and "bench/ring_probe.py" in note
    assert "the scheduler's pace (half the tick over 2 cores, from the 4 ms tick of the profiled host's kernel;" in note, note
    assert ring_pace_note(graph, 4, None) is None and ring_pace_note(graph, 2, 2) is None


@pytest.mark.parametrize("workers", [2, 3])
def test_the_answer_moves_exactly_where_the_note_says_so(graph, workers):
    """One rule for the price and its note: ``--workers N --cores 2`` moves the collectives (their waits) where, and only
    where, the note says the pace: not at 2 on 2 (the ranks fit the cores), at 3 on 2."""
    g = scale_workers(keep_comm_cpu(graph), workers)
    out = share_cores(g, 2, replayer=replay)
    moved = any(out.node_name(i).endswith("waits for a core)") for i in range(len(out)))
    assert moved == (ring_pace_note(graph, workers, 2) is not None) == (workers > 2)


def test_off_lane_waits_only_where_some_is_above_zero(graph):
    """``off_lane_budget`` builds its waits one way, with a pace or without: the waits for a core (``wait_per_cpu`` x each
    row's CPU), the most of them and the pace's floor, and none where no row waits (no node of zero wait in the graph)."""
    four = scale_workers(graph, 4)
    priced = lane_cpu(four, 4, 2)
    moved = np.full(len(four.devices), -1)  # every lane onto the shared cores
    assert off_lane_budget(four, priced, moved).wait_us is None  # no wait per CPU, no pace
    idle = {r: replace(p, off_lane_us=0.0) for r, p in priced.items()}
    assert off_lane_budget(four, idle, moved, 0.5).wait_us is None  # no CPU off the lanes, so nothing waits for a core
    busy = off_lane_budget(four, priced, moved, 0.5)
    assert (busy.cpu_us > 0).all() and busy.wait_us == pytest.approx(busy.cpu_us * 0.5)
    assert off_lane_budget(four, idle, moved, 0.5, ring_pace(four, 4, 2)).wait_us is None  # the recorded tick's pace binds nowhere
    slow = four.replace(meta=four.meta.replace(host_tick_us={h: 4 * t for h, t in four.meta.host_tick_us.items()}))
    pace = ring_pace(slow, 4, 2)
    paced = off_lane_budget(slow, idle, moved, 0.5, pace)  # a 16 ms tick's pace outlasts every collective
    assert paced.wait_us == pytest.approx(paced_us(slow, paced.comm, pace) - slow.dur[paced.comm])
