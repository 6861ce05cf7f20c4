"""A rank pinned alone to a core waits for it only behind its own threads unless another process holds it: the waits
beyond its own threads' CPU are said by ``whatif`` (``analysis.foreign_cpu``), on two fixed recordings of the two-host
Horovod testbed (``tests/data/horovod/pinned-loaded``, ``pinned-quiet``; each rank on a core of its own)."""
from __future__ import annotations

import dataclasses

import msgspec
from testdata import DATA

from dagprof.analysis.foreign_cpu import NOTE_SHARE, foreign_cpu, foreign_cpu_note, foreign_us, pinned_alone
from dagprof.graph.build import build_graph
from dagprof.graph.meta import CoreGroup
from dagprof.pipeline import open_run
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.meta import StepSched

LOADED, QUIET = DATA / "horovod" / "pinned-loaded", DATA / "horovod" / "pinned-quiet"


def test_the_waits_beyond_the_own_threads_cpu():
    assert foreign_us(StepSched(1, cpu_us=40.0, wait_us=70.0, process_cpu_us=80.0)) == 30.0  # 40 us of own threads, 30 of others
    assert foreign_us(StepSched(1, cpu_us=40.0, wait_us=20.0, process_cpu_us=80.0)) == 0.0  # own threads ran outside the waits too
    assert foreign_us(StepSched(1, cpu_us=40.0, wait_us=20.0)) is None  # an older file: no process CPU
    assert StepSched(1, cpu_us=40.0, wait_us=20.0, process_cpu_us=80.0).off_thread_cpu_us == 40.0  # what both read
    assert StepSched(1, cpu_us=40.0, wait_us=20.0).off_thread_cpu_us is None


def test_a_profile_whose_pinned_cores_ran_other_work_says_so_in_every_whatif():
    """Recorded beside other sessions' jobs (the bench's others_cpu_pct 62 %): each rank waited for its core about 30 % of
    its step beyond its own threads' CPU; the note names both ranks, and a bandwidth what-if carries it."""
    g = open_run(LOADED).graph
    assert pinned_alone(g.meta) and g.meta.pinned_groups == {"vm": (CoreGroup(1, 1), CoreGroup(1, 1))}
    f = foreign_cpu(g.meta)
    assert f is not None and set(f.foreign_us) == {0, 1} and f.share > 2 * NOTE_SHARE
    assert all(f.foreign_us[r] > 0.15 * f.step_us[r] for r in (0, 1))
    note = foreign_cpu_note(g.meta)
    assert note is not None and "rank 0" in note and "rank 1" in note and "other processes held the cores" in note
    out = evaluate(g, [Scenario(bandwidth="200Mbit")], tolerance_pct=None)
    assert note in out["notes"]


def test_a_profile_on_quiet_pinned_cores_says_nothing():
    g = open_run(QUIET).graph
    f = foreign_cpu(g.meta)
    assert pinned_alone(g.meta) and f is not None and f.share < NOTE_SHARE and foreign_cpu_note(g.meta) is None


def test_ranks_not_pinned_alone_get_no_note_though_their_waits_are_counted():
    """Without the sets (as an unpinned run records them) another rank's work may be what held the cores: no note."""
    run = read_run(LOADED)
    run = dataclasses.replace(run, ranks=[dataclasses.replace(t, meta=msgspec.structs.replace(t.meta, cpu_set="")) for t in run.ranks])
    g = build_graph(run)
    assert not pinned_alone(g.meta) and foreign_cpu(g.meta) is not None and foreign_cpu_note(g.meta) is None
