"""The ``level`` term of the 90 % interval (``analysis.interval``): an FSDP profile's unprofiled single steps tell how far
a later run's level may sit from the profile's, so each side reaches at least their half-width, the compute floor
too; DDP's intervals are left as they were. On vendored recordings: the part-12 tied LM's FSDP profile of one
round (``fsdp-part12-level``), the tied LM profile that recorded its threads (``fsdp-fresh/tiedlm-wake``) and a DDP
testbed profile (``ddp-testbed-corrected``)."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis.interval import PredictionInterval, RunLevel, predict_interval, run_level, step_spread
from dagprof.passes.profiler_cost import job_steps, measure_profiler_cost, steady_from, window_sides
from dagprof.pipeline import open_run
from dagprof.replay import replay

ROUND = DATA / "fsdp-part12-level" / "round0"


def test_the_step_spread_is_a_single_step_s_and_one_stall_does_not_move_it():
    steps = [100.0, 101.0, 99.0, 102.0, 98.0, 100.0, 103.0, 97.0]
    s = step_spread(steps)
    assert s == pytest.approx(1.6448536 * 1.4826 * 1.5 / 100.0)
    assert step_spread(steps + [400.0]) == pytest.approx(step_spread(steps + [104.0]))  # a stalled step counts as any slow one
    assert step_spread([100.0]) == 0.0 and step_spread([]) == 0.0


@pytest.mark.parametrize("run", [ROUND / "fsdp", DATA / "fsdp-fresh" / "tiedlm-wake"])
def test_an_fsdp_profile_s_level_is_its_unprofiled_steps_spread(run):
    g = open_run(str(run)).graph
    level = run_level(g, measure_profiler_cost(g), False)
    loop = g.meta.loop_steps
    before, after = window_sides(loop, g.meta.steps, g.meta.job_of)
    assert "level" in level.terms and level.level > 0
    # the steps the drift term brought together (no drift here: then exactly the unprofiled steps')
    if "drift" not in level.terms:
        assert level.level == pytest.approx(step_spread(before + after))
    # wider than a run's median's own interval: the level a later run may take is a step's, not a median's
    assert level.level > level.unprofiled / 2
    assert len(job_steps(loop.unprofiled, None, g.meta.job_of, steady_from(loop))) >= 5


def test_each_side_reaches_the_level_and_the_floor_is_lowered_by_it():
    p = PredictionInterval(100.0, 99.0, 101.0, terms=("steps",))
    w = p.widened(RunLevel(level=0.12, terms=("level",)))
    assert w.lo_us == pytest.approx(88.0) and w.hi_us == pytest.approx(112.0)
    g = open_run(str(ROUND / "fsdp")).graph
    res = replay(g)
    run = run_level(g, measure_profiler_cost(g), False)
    with_level = predict_interval(g, res, run=run)
    without = predict_interval(g, res, run=RunLevel(**{**run.__dict__, "level": 0.0, "terms": tuple(t for t in run.terms if t != "level")}))
    assert with_level.point_us == without.point_us
    assert with_level.lo_us <= with_level.point_us * (1 - run.level) + 1e-6 or "compute_floor" in with_level.terms
    assert with_level.lo_us <= without.lo_us and with_level.hi_us >= without.hi_us
    assert with_level.hi_us >= with_level.point_us * (1 + run.level) - 1e-6


def test_a_ddp_profile_has_no_level_term():
    """DDP's intervals held 89 % of the kept runs without it: a DDP testbed profile, unprofiled steps and all, gets none."""
    g = open_run(str(DATA / "ddp-testbed-corrected" / "0" / "r2" / "run")).graph
    level = run_level(g, measure_profiler_cost(g), False)
    assert "level" not in level.terms and level.level == 0.0
    assert "unprofiled_steps" in level.terms  # it has the steps: the term is left out, not unmeasured
    res = replay(g)
    assert np.isfinite(predict_interval(g, res, run=level).lo_us)
