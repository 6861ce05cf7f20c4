"""A rank pinned alone to a core waits for it only behind its own threads unless another process holds it: the waits
beyond its own threads' CPU are taken out of its op times by ``whatif`` and said (``analysis.foreign_cpu``), on two fixed
recordings of the two-host Horovod testbed (``tests/data/horovod/pinned-loaded``, ``pinned-quiet``; each rank on a core
of its own)."""
from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
from testdata import DATA

from dagprof.analysis.foreign_cpu import NOTE_SHARE, foreign_cpu, foreign_cpu_note, foreign_us, pinned_alone, remove_foreign_load
from dagprof.graph.build import build_graph
from dagprof.graph.meta import CoreGroup
from dagprof.passes.foreign_load import scale_loaded_ranks
from dagprof.pipeline import open_run
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import CommRole, Kind
from dagprof.traces.meta import StepSched

LOADED, QUIET = DATA / "horovod" / "pinned-loaded", DATA / "horovod" / "pinned-quiet"


def test_the_waits_beyond_the_own_threads_cpu():
    assert foreign_us(StepSched(1, cpu_us=40.0, wait_us=70.0, process_cpu_us=80.0)) == 30.0  # 40 us of own threads, 30 of others
    assert foreign_us(StepSched(1, cpu_us=40.0, wait_us=20.0, process_cpu_us=80.0)) == 0.0  # own threads ran outside the waits too
    assert foreign_us(StepSched(1, cpu_us=40.0, wait_us=20.0)) is None  # an older file: no process CPU
    assert StepSched(1, cpu_us=40.0, wait_us=20.0, process_cpu_us=80.0).off_thread_cpu_us == 40.0  # what both read
    assert StepSched(1, cpu_us=40.0, wait_us=20.0).off_thread_cpu_us is None


def test_a_profile_whose_pinned_cores_ran_other_work_has_it_taken_out_and_said():
    """Recorded beside other sessions' jobs (the bench's others_cpu_pct 62 %): each rank waited for its core 21-30 % of
    its step beyond its own threads' CPU. Every what-if starts from the op times with each rank's host work scaled by the
    share of its core it kept, --raw or not, says so with each rank's factor, and the model is checked against the
    profiled step less what that removed."""
    g = open_run(LOADED).graph
    assert pinned_alone(g.meta) and g.meta.pinned_groups == {"vm": (CoreGroup(1, 1), CoreGroup(1, 1))}
    f = foreign_cpu(g.meta)
    assert f is not None and set(f.foreign_us) == {0, 1} and f.share > 2 * NOTE_SHARE
    assert all(f.foreign_us[r] > 0.15 * f.step_us[r] for r in (0, 1))
    note = foreign_cpu_note(g.meta)
    assert note is not None and "rank 0" in note and "rank 1" in note and "other processes held the cores" in note
    unpinned = g.replace(meta=dataclasses.replace(g.meta, pinned_groups={}))  # the same op times, not known to be pinned
    for raw in (False, True):
        out = evaluate(g, [Scenario(bandwidth="200Mbit")], measured_us=open_run(LOADED).analysis.measured_us, raw=raw)
        said = out["foreign_load"]
        assert set(said["factors"]) == {0, 1}
        assert all(abs(said["factors"][r] - (1 - f.foreign_us[r] / f.step_us[r])) < 1e-9 for r in (0, 1))
        assert 10 < said["removed_pct"] < 40 and said["text"] in out["notes"] and note not in out["notes"]
        assert "rank 0 x0." in said["text"] and "rank 1 x0." in said["text"]
        base = evaluate(unpinned, [Scenario(bandwidth="200Mbit")], tolerance_pct=None, raw=raw)
        assert base["foreign_load"] is None
        assert out["scenarios"][0].predicted_iter_ms < base["scenarios"][0].predicted_iter_ms


def test_a_loaded_ranks_work_and_the_host_collectives_are_scaled_not_its_waits_nor_the_others():
    g = open_run(LOADED).graph
    h = scale_loaded_ranks(g, {1: 0.5})
    one = g.rank == 1
    waits = np.isin(g.kind, [int(Kind.COMM_WAIT), int(Kind.STEP), int(Kind.SYNC)])
    work = one & np.isin(g.kind, [int(Kind.FORWARD), int(Kind.BACKWARD)])
    assert work.any() and np.allclose(h.dur[work], 0.5 * g.dur[work])
    neg = g.role == int(CommRole.NEGOTIATION)  # the coordinator's (rank 0's) agreement with every rank: the slowest's pace
    assert (neg & (g.rank == 0)).any() and not (neg & one).any() and np.allclose(h.dur[neg], 0.5 * g.dur[neg])
    assert np.array_equal(h.dur[(g.rank == 0) & ~neg], g.dur[(g.rank == 0) & ~neg]) and np.array_equal(h.dur[waits], g.dur[waits])
    assert np.allclose(h.gap[one], 0.5 * g.gap[one])
    comm = g.kind == int(Kind.COMM)
    assert comm.any() and np.array_equal(h.dur[comm], g.dur[comm])  # the wire not known: the collectives as profiled
    at = g.replace(meta=dataclasses.replace(g.meta, wire_bytes_per_s=1e9 / 8))  # --profiled-bandwidth 1Gbit
    h = scale_loaded_ranks(at, {0: 0.8, 1: 0.5})
    # CPU ranks: a collective's time beyond its wire's is their threads' work, scaled by the least factor; never below the wire
    shrunk = h.dur[comm] < g.dur[comm]
    assert shrunk.any() and (h.dur[comm] >= 0.5 * g.dur[comm]).all() and (h.dur[comm] <= g.dur[comm]).all()


def test_a_profile_on_quiet_pinned_cores_says_nothing_and_keeps_its_op_times():
    g = open_run(QUIET).graph
    f = foreign_cpu(g.meta)
    assert pinned_alone(g.meta) and f is not None and f.share < NOTE_SHARE and foreign_cpu_note(g.meta) is None
    assert remove_foreign_load(g, None, lambda x: 1.0) is None


def _unpinned(folder):
    """The run's graph as an unpinned run records it (no CPU sets)."""
    run = read_run(folder)
    return build_graph(dataclasses.replace(run, ranks=[dataclasses.replace(t, meta=msgspec.structs.replace(t.meta, cpu_set=""))
                                                       for t in run.ranks]))


def test_ranks_not_pinned_alone_get_no_note_nor_removal_though_their_waits_are_counted():
    """Without the sets (as an unpinned run records them) another rank's work may be what held the cores: nothing said or removed."""
    g = _unpinned(LOADED)
    assert not pinned_alone(g.meta) and foreign_cpu(g.meta) is not None and foreign_cpu_note(g.meta) is None
    assert remove_foreign_load(g, None, lambda x: 1.0) is None


def test_load_factors_leave_a_rank_whose_recorded_wait_fills_its_step_as_profiled():
    """A rank at 50 % is brought to its core's pace (x0.5), one under NOTE_SHARE is quiet, and one whose median wait is its
    whole median step or more (odd records) is left as profiled rather than scaled to zero or below."""
    from dagprof.analysis.foreign_cpu import ForeignCpu, load_factors

    f = ForeignCpu({0: 100.0, 1: 100.0, 2: 100.0, 3: 100.0}, {0: 50.0, 1: 5.0, 2: 100.0, 3: 140.0})
    assert load_factors(f) == {0: 0.5}
