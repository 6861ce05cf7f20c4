"""``bench/fsdp_whatif_table.profile_level`` on a vendored part-12 round (``fsdp-part12-level``, whose FSDP profile ran 21 %
over its setup's unprofiled job): the split of the profiled setup's step into the profile's in-run excess and the whole
profiled job's level against the job, from the files as recorded (no timing)."""
from __future__ import annotations

import json
import os
import statistics
import sys

import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import fsdp_whatif_table as table  # noqa: E402

from dagprof.passes.profiler_cost import measure_profiler_cost  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402

ROUND = DATA / "fsdp-part12-level" / "round0"


def _times(folder: str) -> list[float]:
    with open(ROUND / folder / "times.json") as f:
        return [t * 1e3 for t in json.load(f)]


def test_the_profiled_setup_splits_into_in_run_and_level():
    lv = table.profile_level(str(ROUND), "fsdp", "text")
    steps = _times("fsdp-log")
    assert lv.window_ms == statistics.median(steps[4:14])  # the manifest's window, [4, 14)
    assert lv.after_ms == statistics.median(steps[14:])
    assert lv.job_ms == statistics.median(_times("2r-1Gbit")[table.WARMUP:])  # the table's measured statistic
    assert (1 + lv.in_run_pct / 100) * (1 + lv.level_pct / 100) == pytest.approx(lv.window_ms / lv.job_ms)
    assert lv.cost == "text"


def test_rank_0s_times_are_the_steps_the_collector_timed():
    """The level reads the script's own step times; they are the collector's (``LoopSteps``) to within a millisecond, in
    the window and outside it, so the in-run split is the same steps ``measure_profiler_cost`` compares."""
    loop = open_run(ROUND / "fsdp").graph.meta.loop_steps
    steps = _times("fsdp-log")
    timed = loop.profiled[0] | loop.unprofiled[0]
    assert sorted(timed) == list(range(len(steps)))
    assert sorted(loop.profiled[0]) == list(range(4, 14))
    assert all(abs(steps[k] - timed[k] / 1e3) < 1.0 for k in timed)


def test_the_cost_on_that_round_is_read_from_the_training_threads_cpu():
    """The in-run excess (+6.6 %) is inside the wall steps' noise, but the ranks' training threads spent more CPU a step in
    the window beyond theirs, and that CPU is the correction (4.8 %, ``thread_cpu_cost``): most of that round's 21 % is
    still the level, which no profile holds."""
    g = open_run(ROUND / "fsdp").graph
    cost = measure_profiler_cost(g)
    assert cost.usable and cost.noisy_wall is not None and cost.noisy_wall.startswith("profiled 258.8 ms/step")
    assert 100 * cost.share == pytest.approx(4.8, abs=0.05)
    lv = table.profile_level(str(ROUND), "fsdp", cost.describe())
    assert lv.level_pct > lv.in_run_pct > 0
