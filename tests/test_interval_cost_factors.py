"""The profiler cost's spread replayed per scenario (``analysis.interval.cost_factors``), on a testbed round whose cost was
corrected (tests/data/ddp-testbed-corrected: 2 gloo ranks, 1 Gbit/s, 1 MiB buckets, profiled 324.6 ms a step against 306.5
unprofiled, -5.6 +- 1.5 %; the ranks' CPU added 15.3 ms a step together). The step is mostly wire: the correction removes
no more host work than the cost can have added to it (each rank's host ops lengthened by the step's 18.1 ms of excess:
factor 0.72, ``passes.profiler_cost.bound_factor``); the step's own reading, one factor that takes the whole excess out of
the host work, is 0.51. The interval reaches from the one to the other at the cost's ends: a cell whose step is mostly
host work (the unshaped link) moves with the factor far more than the profiled step's share says."""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys

import pytest
from testdata import DATA

from dagprof.analysis import job_iteration_us
from dagprof.analysis.interval import LEVEL, cost_factors
from dagprof.costmodel.topology import Topology
from dagprof.passes import fit_topology, set_topology
from dagprof.passes.average_steps import average_steps
from dagprof.passes.profiler_cost import host_work_us, measure_profiler_cost, remove_profiler_cost, scale_host_work
from dagprof.pipeline import open_run
from dagprof.replay import replay

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "testbed"))

import run as testbed  # noqa: E402

KEPT = DATA / "ddp-testbed-corrected"


def test_the_factor_s_ends_bracket_the_bound_and_the_step_s_reading():
    g = open_run(KEPT / "0" / "r2" / "run").graph
    cost = measure_profiler_cost(g)
    assert cost.usable and cost.loaded is None and cost.cpu_us == pytest.approx(15294, rel=0.01)
    averaged = average_steps(g, replay)
    model = set_topology(averaged, Topology.flat(2, fit_topology(averaged).inter))
    _, factor = remove_profiler_cost(averaged, cost, job_iteration_us, model=model)
    _, by_step = remove_profiler_cost(averaged, cost, job_iteration_us, model=model, bounded=False)
    more, less = cost_factors(averaged, cost, factor, job_iteration_us, model=model)
    bound = 1.0 - 2 * (cost.profiled_us - cost.unprofiled_us) / host_work_us(averaged)  # each rank's host work less the excess
    assert factor == pytest.approx(bound) and by_step < 0.6 < bound < 0.8  # the point removes what the cost can be made of
    assert 0.05 / factor <= more * 1.0001 and more * factor < by_step < factor <= less * factor  # the range reaches past the step's reading
    # on the profiled model, the fast end takes out the cost's upper end (its standard error at the normal quantile)
    z = statistics.NormalDist().inv_cdf(0.5 + LEVEL / 2)
    raw = job_iteration_us(model)
    fast = job_iteration_us(scale_host_work(model, factor * more))
    assert (raw - fast) / raw == pytest.approx(cost.share + z * cost.stderr_us / cost.profiled_us, abs=0.003)


def test_host_heavy_cells_carry_the_factor_s_spread():
    """The round's cells predicted again (``bench/testbed/run.py --repredict``): where the correction applied, the unshaped
    cells' intervals reach the replays at the factor's ends. With the step's factor as the point, 10 of 18 cell medians
    inside (every unshaped one out), 14 with the CPU's reading in the range; with the bounded factor as the point, 15
    (the 2-rank unshaped 1 and 25 MiB cells 29-34 % above their points, the 4-rank 1 Gbit/s 5 MiB cell, which ran as
    slow as 25 MiB, 6 % above); with the unshaped cells reaching the cores' bound (``shared_cores``), 16: the 1 MiB
    cell's buckets overlap its backward, the 25 MiB cell's one bucket follows it and stays out."""
    args = argparse.Namespace(profiled=testbed.PROFILED, swept=testbed.SWEPT, ranks=[2, 4], rates=list(testbed.RATES), caps=testbed.CAPS_MB,
                              cores=2, calibrated={}, repredict=str(KEPT))
    measured, predicted, intervals = testbed.one_round(args, str(KEPT / "0"), random.Random(0))
    assert predicted["cost"].startswith("op times corrected for the profiler's cost: -5.6 %")
    inside = {cell: intervals[("corrected", *cell)].contains(1e3 * statistics.median(steps)) for cell, steps in measured.items()}
    assert sum(inside.values()) == 16
    assert not any(inside[cell] for cell in ((2, "unlimited", 25.0), (4, "1Gbit", 5.0)))
    for cell in measured:  # every interval holds its point, and the unshaped ones reach far below it
        iv = intervals[("corrected", *cell)]
        assert iv.lo_us < iv.point_us < iv.hi_us
        assert ("profiler_cost" in iv.terms) and (iv.lo_us / iv.point_us < 0.75) == (cell[1] == "unlimited")
