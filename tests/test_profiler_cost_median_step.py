"""The profiler-cost correction's bound (``passes.profiler_cost.bound_factor``) is read on the window's median step, as
the cost is: a window step unlike the others sets no bound for them. The recording costs CPU per op it records, so a step
of many more ops (PPO's rollout, one step in 8: 52,098 Kineto ops in 293 ms against 839 in 24) held every step's cut to
7.8 % where the median step ran 27 % over the steps outside the window (docs/evidence.md, branch level69). Here the
vendored DNA transformer (tests/data/ddp-fresh/dna-val-own) runs an evaluation pass in its first window step."""
from __future__ import annotations

import statistics

import numpy as np
import pytest
from testdata import DATA

from dagprof.passes.profiler_cost import ProfilerCost, _host_work, bound_factor, host_work_us, scale_host_work
from dagprof.pipeline import open_run


def per_step_host_work(g) -> list[float]:
    host, mask = _host_work(g)
    work = np.where(mask, g.dur, 0.0) + np.where(host, g.gap, 0.0)
    return [float(work[g.step == s].sum()) for s in g.meta.steps]


def test_a_window_step_unlike_the_others_sets_no_bound_for_them():
    g = open_run(DATA / "ddp-fresh" / "dna-val-own").graph
    steps = per_step_host_work(g)
    assert max(steps) > 1.8 * statistics.median(steps)  # the evaluation pass's step
    assert host_work_us(g) == pytest.approx(statistics.median(steps))
    excess = 10_000.0  # the job's median step 10 ms over its unprofiled one; the ranks' CPU explains it
    cost = ProfilerCost(130_000.0, 130_000.0 - excess, 5, 7, 1_000.0, None, cpu_us=15_000.0)
    factor = bound_factor(g, cost)
    # each rank's median step loses the step's whole excess (not a share of the window's mean, which the evaluation holds)
    assert (1.0 - factor) * statistics.median(steps) == pytest.approx(2 * excess)
    cut = statistics.median(per_step_host_work(scale_host_work(g, factor)))
    assert statistics.median(steps) - cut == pytest.approx(2 * excess, rel=0.01)
