"""More TF/JAX workers than the profiled host's cores. Where the run recorded each rank's process CPU (the TF/JAX collector
since 2026-12-06), ``--cores`` prices the ranks sharing the cores (``share_cores``: the lanes' op times scaled to the
lanes' CPU, their threads' own where recorded by thread name, else the rank's CPU over wall, the rest of its CPU queued
beside its collectives); without ``--cores`` a line says each rank keeps cores of its own, with its CPU. A run that did
not record the CPU is said not priced in one line; fewer workers than cores and other frameworks say nothing, and
nothing moves without ``--cores``."""
import dataclasses

import numpy as np
import pytest

from dagprof.passes.comm_cpu import lane_threads, rank_cpu
from dagprof.passes.compute import process_cpu_note, share_cores
from dagprof.passes.workers import scale_workers
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.search.scenario import Cluster, Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.events import Kind
from dagprof.traces.meta import OtherThreads, StepSched

RUN = "tests/data/tf/transformer"  # 2 TF workers on host vm's 2 cores, unprofiled steps timed, no CPU recorded


@pytest.fixture(scope="module")
def graph():
    return open_run(RUN).graph


def with_cpu(g, cpu_us: float, wait_us: float = 0.0):
    """``g`` as if its collector had recorded every step's process CPU: ``cpu_us`` outside the window, twice it inside;
    the training thread's CPU half of it, ``wait_us`` its waits for a core."""
    loop = g.meta.loop_steps
    sched = {r: {s: StepSched(s, cpu_us / 2, wait_us, cpu_us * (2 if s in loop.profiled[r] else 1), 3)
                 for s in [*loop.profiled[r], *loop.unprofiled[r]]} for r in loop.profiled}
    return g.replace(meta=g.meta.replace(loop_steps=dataclasses.replace(loop, sched=sched)))


def test_with_the_cpu_the_note_says_own_cores_and_cores_prices_it(graph):
    g = with_cpu(graph, 20_000.0)
    note = process_cpu_note(g, 4, 100_000.0, None)
    assert note.startswith("--workers 4: each rank is priced on cores of its own, where on the 2 cores of their host (vm) they would share them")
    assert "process used 20.0 ms of CPU a step" in note  # the unprofiled steps' (the window's holds the profiler's)
    assert "4 of them 40% of the 2 cores at the 100.0 ms step predicted" in note
    assert "--cores 2 queues each rank's CPU on them" in note and "at least 40 ms" in note
    assert process_cpu_note(g, 4, 100_000.0, 2) is None  # priced


def test_without_the_cpu_it_is_said_not_priced(graph):
    note = process_cpu_note(graph, 4, 50_000.0, 2)  # recorded before 2026-12-06: no CPU
    assert note.startswith("--workers 4 on the 2 cores of one host (vm) is not priced for ranks that share them: the run did not record")
    assert "--cores 2 queues only the ops on the lanes" in note
    assert "each rank is priced on cores of its own" in process_cpu_note(graph, 4, 50_000.0, None)


def test_no_note_within_the_cores_or_for_another_framework(graph):
    g = with_cpu(graph, 20_000.0)
    assert process_cpu_note(g, 2, 50_000.0, None) is None
    assert process_cpu_note(g.replace(meta=g.meta.replace(framework=None)), 4, 50_000.0, 2) is None
    assert rank_cpu(g.replace(meta=g.meta.replace(framework=None))) is None and rank_cpu(graph) is None


def test_the_price_queues_each_ranks_cpu_on_the_cores(graph):
    four = scale_workers(with_cpu(graph, 200_000.0, wait_us=100_000.0), 4, replicate=True)
    plain = share_cores(scale_workers(graph, 4, replicate=True), 2)
    priced = share_cores(four, 2)
    added = np.flatnonzero([".off-lane cpu " in priced.node_name(int(v)) for v in range(len(priced))])
    cores = [i for i, d in enumerate(priced.devices) if d.name.endswith("(2 cores)")]
    assert len(added) and np.isin(priced.device[added], cores).all()
    steps = len(graph.meta.steps)
    on_core = rank_cpu(four)[0].on_core
    assert on_core == pytest.approx(0.5)  # the training thread's 100 ms CPU and 100 ms waits for a core: half its runnable time
    lanes = np.isin(plain.device, cores) & ~np.isin(plain.kind, [int(Kind.STEP), int(Kind.COMM_WAIT)]) & (np.arange(len(plain)) < len(four))
    for r in range(4):
        mine = added[priced.rank[added] == r]
        lane_us = plain.dur[lanes & (plain.rank == r)].sum() * on_core / steps
        assert priced.dur[mine].sum() / steps == pytest.approx(200_000.0 - lane_us, rel=1e-6)  # the rest of its CPU
    res = replay(priced)
    on = np.isin(priced.device, cores)
    assert res.end.max() - res.start.min() >= priced.dur[on].sum() / 2  # 2 cores can do no more
    assert replay(plain).end.max() < res.end.max()


def test_whatif_moves_only_with_cores_and_only_with_the_cpu(graph):
    g = with_cpu(graph, 200_000.0)
    rows = [Scenario(workers=4)]
    for cores in (None, 2):
        got = evaluate(g, rows, Cluster(cores=cores), tolerance_pct=None)
        before = evaluate(graph, rows, Cluster(cores=cores), tolerance_pct=None)
        p, b = got["scenarios"][0].predicted_iter_ms, before["scenarios"][0].predicted_iter_ms
        assert (p > 1.5 * b) if cores else (p == b)
        assert len([n for n in got["notes"] if n.startswith("--workers 4")]) == (0 if cores else 1)
    within = evaluate(g, [Scenario()], Cluster(cores=2), tolerance_pct=None)["scenarios"][0].predicted_iter_ms  # 2 ranks, 2 cores
    assert within == evaluate(graph, [Scenario()], Cluster(cores=2), tolerance_pct=None)["scenarios"][0].predicted_iter_ms


def with_named(g, cpu_us: float, train_us: float, pool_us: float, other_us: float, more: dict[str, OtherThreads] | None = None):
    """``g`` with every step's CPU recorded by thread name, as the TF window has since 2026-12-06: the training thread
    ``train_us``, the ``tf_Compute`` pool (the lanes' threads) ``pool_us``, ``collective_ops`` (off the lanes) ``other_us``,
    ``more`` names, the process ``cpu_us``."""
    loop = g.meta.loop_steps
    named = {"tf_Compute": OtherThreads(pool_us, 0.0, 5), "collective_ops": OtherThreads(other_us, 0.0, 5), **(more or {})}
    sched = {r: {s: StepSched(s, train_us, train_us, cpu_us, 3, OtherThreads(pool_us + other_us, 0.0, 10), named)
                 for s in [*loop.profiled[r], *loop.unprofiled[r]]} for r in loop.profiled}
    return g.replace(meta=g.meta.replace(loop_steps=dataclasses.replace(loop, sched=sched)))


def test_the_lanes_are_priced_at_their_threads_own_cpu_where_recorded_by_name(graph):
    """With the CPU recorded per thread name, the lanes' threads' (the training thread's and the pools' that carry the
    lanes') is what the lanes hold on the cores, the rest of the process's CPU off them; no stand-in scale."""
    assert lane_threads(graph, 1) == {"tf_Compute"}  # xplane's ``rank1/tf_Compute/<line id>``: the pool's comm
    g = with_named(graph, 200_000.0, 30_000.0, 50_000.0, 20_000.0, {"tf_data_private": OtherThreads(0.0, 1.0, 1)})
    cpu = rank_cpu(g)
    assert all(c.lanes_us == pytest.approx(80_000.0) for c in cpu.values())  # training thread + tf_Compute, not collective_ops
    four = scale_workers(g, 4, replicate=True)
    priced = share_cores(four, 2)
    steps = len(graph.meta.steps)
    added = np.flatnonzero([".off-lane cpu " in priced.node_name(int(v)) for v in range(len(priced))])
    cores = [i for i, d in enumerate(priced.devices) if d.name.endswith("(2 cores)")]
    lanes = np.isin(priced.device, cores) & ~np.isin(priced.kind, [int(Kind.STEP), int(Kind.COMM_WAIT)]) & (np.arange(len(priced)) < len(four))
    for r in range(4):
        assert priced.dur[lanes & (priced.rank == r)].sum() / steps == pytest.approx(80_000.0, rel=1e-6)
        assert priced.dur[added[priced.rank[added] == r]].sum() / steps == pytest.approx(120_000.0, rel=1e-6)
    assert all(c.lanes_us is None for c in rank_cpu(with_cpu(graph, 200_000.0)).values())  # not by name: the stand-in


def test_a_lane_whose_threads_were_not_recorded_by_its_name_keeps_the_stand_in(graph):
    """Rank 0's lanes run on ``tf_Compute`` and ``tf_data_private`` threads; a record without the latter's name (a pool the
    kernel names otherwise) would leave a lane's CPU out, so that rank keeps the stand-in, rank 1 (``tf_Compute`` only)
    its threads' CPU."""
    assert lane_threads(graph, 0) == {"tf_Compute", "tf_data_private"}
    cpu = rank_cpu(with_named(graph, 200_000.0, 30_000.0, 50_000.0, 20_000.0))
    assert cpu[0].lanes_us is None and cpu[1].lanes_us == pytest.approx(80_000.0)
