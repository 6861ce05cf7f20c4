"""The script's own time between the steps dagprof times (``passes.profiler_cost.between_steps_us``): in the model's
steps, not in the unprofiled steps the profiler's cost is measured against, so said, never corrected (issue 20 item 2)."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from dagprof.cli.main import main
from dagprof.passes.profiler_cost import BETWEEN_SHARE, measure_profiler_cost
from dagprof.pipeline import open_run

DATA = os.path.join(os.path.dirname(__file__), "data")


def test_a_custom_loop_s_time_between_steps_is_measured_and_said(capsys):
    """``tf/recsys-ragged``: 8 profiled steps of a custom loop whose ranks spend 3-6 ms between the collector's step
    timings; the trace's mark-to-mark steps (each rank's measured mean) hold it on top of the timed steps."""
    path = os.path.join(DATA, "tf", "recsys-ragged")
    g = open_run(path).graph
    cost = measure_profiler_cost(g)
    assert cost.between_us is not None and cost.between_us >= BETWEEN_SHARE * cost.profiled_us
    loop = g.meta.loop_steps
    per_rank = [g.meta.measured_iter_us[r] - statistics.mean(loop.profiled[r].values()) for r in loop.profiled]
    assert min(per_rank) - 500 <= cost.between_us <= max(per_rank) + 500  # each rank's marks less its timed steps
    assert "between the steps dagprof times" in cost.describe()
    assert main(["whatif", path, "--no-trace", "--allow-model-error", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["profiler_cost"]
    assert out["between_steps_ms"] == cost.between_us / 1e3 and out["text"] == cost.describe()


def test_a_loop_without_work_between_steps_says_nothing():
    """``tf/fit-margins`` (Keras ``fit``): under a millisecond between the callback's timings, below the share said."""
    cost = measure_profiler_cost(open_run(os.path.join(DATA, "tf", "fit-margins")).graph)
    assert cost.between_us is not None and 0.0 <= cost.between_us < 1000.0
    assert "between the steps" not in cost.describe()


def test_not_measured_on_torch_or_jax_runs():
    """Only TensorFlow's runs were compared (a JAX step returns before its dispatched work ends; PyTorch times otherwise)."""
    cost = measure_profiler_cost(open_run(os.path.join(DATA, "profiler-spike", "hog-window")).graph)
    assert cost.profiled_us is not None and cost.between_us is None and "between the steps" not in cost.describe()
    jax = measure_profiler_cost(open_run(os.path.join(DATA, "tf-jax", "lstm-lm-loaded")).graph)
    assert jax.profiled_us is not None and jax.between_us is None and "between the steps" not in jax.describe()


def test_the_bench_splits_a_kept_profile_s_model_against_its_unprofiled_steps():
    """``bench/tf_profiler_cost_split.py`` on ``tf/recsys-ragged``: the model's mean and median against the unprofiled
    median as ``whatif`` gives them, the between-step time taken out of the mean; a run without timed steps says so."""
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "tf_profiler_cost_split.py")
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    path = os.path.join(DATA, "tf", "recsys-ragged")
    done = subprocess.run([sys.executable, script, path, os.path.join(DATA, "tf", "loop"), "--json"], capture_output=True,
                          text=True, check=True, env=dict(os.environ, PYTHONPATH=src))
    row, old = json.loads(done.stdout)
    assert old["error"] == "no unprofiled steps timed"
    u = row["unprofiled_median_ms"]
    assert row["mean_pct"] == pytest.approx(100 * (row["model_mean_ms"] / u - 1))
    assert row["between_steps_ms"] == pytest.approx(measure_profiler_cost(open_run(path).graph).between_us / 1e3)
    assert row["mean_less_between_pct"] < row["mean_pct"]  # the cost is not removed here: the whole time comes off
    assert row["mean_less_between_pct"] == pytest.approx(100 * ((row["model_mean_ms"] - row["between_steps_ms"]) / u - 1))
