"""More TF/JAX workers than the profiled host's cores: ``whatif --workers N`` says in one line that ranks sharing cores are
not priced, with each rank's process CPU a step (recorded by the TF/JAX collector since 2026-12-06) against its lanes'
op time; runs that did not record it, fewer workers than cores, and other frameworks say nothing."""
import dataclasses

import pytest

from dagprof.passes.compute import process_cpu_note
from dagprof.pipeline import open_run
from dagprof.search.scenario import Cluster, Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.meta import StepSched

RUN = "tests/data/tf/transformer"  # 2 TF workers on host vm's 2 cores, unprofiled steps timed, no CPU recorded


@pytest.fixture(scope="module")
def graph():
    return open_run(RUN).graph


def with_cpu(g, cpu_us: float):
    """``g`` as if its collector had recorded every step's process CPU: ``cpu_us`` outside the window, twice it inside."""
    loop = g.meta.loop_steps
    sched = {r: {s: StepSched(s, cpu_us / 2, 0.0, cpu_us * (2 if s in loop.profiled[r] else 1), 3)
                 for s in [*loop.profiled[r], *loop.unprofiled[r]]} for r in loop.profiled}
    return g.replace(meta=g.meta.replace(loop_steps=dataclasses.replace(loop, sched=sched)))


def test_more_workers_than_cores_are_said_not_priced_with_the_ranks_cpu(graph):
    g = with_cpu(graph, 20_000.0)
    note = process_cpu_note(g, 4, 100_000.0, 2)
    assert note.startswith("--workers 4 on vm's 2 cores is not priced for ranks that share them")
    assert "process used 20.0 ms of CPU a step" in note  # the unprofiled steps' (the window's holds the profiler's)
    assert "4 of them 40% of the 2 cores at the 100.0 ms step predicted" in note
    assert "--cores 2 queues only the ops on the lanes" in note and "at least 40 ms" in note
    assert "each rank is priced on cores of its own" in process_cpu_note(g, 4, 100_000.0, None)


def test_no_note_within_the_cores_without_the_cpu_or_for_another_framework(graph):
    g = with_cpu(graph, 20_000.0)
    assert process_cpu_note(g, 2, 50_000.0, None) is None
    assert process_cpu_note(graph, 4, 50_000.0, 2) is None  # recorded before 2026-12-06: no CPU
    assert process_cpu_note(g.replace(meta=g.meta.replace(framework=None)), 4, 50_000.0, 2) is None


def test_whatif_says_it_once_and_keeps_its_points(graph):
    g = with_cpu(graph, 20_000.0)
    rows = [Scenario(workers=4)]
    got = evaluate(g, rows, Cluster(cores=2), tolerance_pct=None)
    before = evaluate(graph, rows, Cluster(cores=2), tolerance_pct=None)
    said = [n for n in got["notes"] if "not priced for ranks that share them" in n]
    assert len(said) == 1 and not [n for n in before["notes"] if "not priced for ranks that share them" in n]
    assert got["scenarios"][0].predicted_iter_ms == before["scenarios"][0].predicted_iter_ms  # the note prices nothing
