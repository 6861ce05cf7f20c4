"""``bench/bench_frameworks.py --testbed``'s change error: the what-if's own change against the measured one from the profiled
rate's level around the measurement (reference jobs just before and after it), apart from the model's error on the profiled
job and from a level that moved between jobs. The figures are kept jax_gnn_jit rounds' (2026-12-03, 100 -> 40 Mbit/s): a
profiled job at 71.3 ms (its model 71.1) where the other jobs at 100 Mbit/s ran 43-49 ms. And its interval check: the
measured job's unprofiled median step inside the what-if's interval, as ``bench/bench_coverage.py`` judges it."""
from __future__ import annotations

import os
import sys

import pytest
from testdata import DATA

from dagprof.pipeline import open_run

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from bench_frameworks import _round, _summary  # noqa: E402
from shaped_loopback import measured, predict_rate, unprofiled_steps_us  # noqa: E402

PROFILED = {"load": 2.3, "measured_ms": 70.7, "measured_median_ms": 71.3, "model_median_ms": 71.1, "model_median_pct": -0.3,
            "predicted_ms": 110.0, "predicted_median_ms": 111.8, "predicted_comm_ms": 104.0, "comm_ms": 63.8, "most_comm_ms": 110.0,
            "interval_ms": [66.1, 153.5]}
OTHER = {"load": 2.1, "measured_ms": 80.9, "measured_median_ms": 82.2, "comm_ms": 75.7}


def ref(median_ms: float) -> dict:
    return {"load": 2.2, "measured_ms": median_ms, "measured_median_ms": median_ms, "comm_ms": median_ms - 6.0}


def test_a_profiled_job_above_its_configurations_level_is_drift_not_the_what_ifs_error():
    row = _round(1, PROFILED, OTHER, (ref(43.4), ref(45.6)))
    assert row["error_pct"] == pytest.approx(36.0, abs=0.1)  # the headline: against the measured job alone
    assert row["level_drift_pct"] == pytest.approx(100 * (71.3 - 44.5) / 44.5) and row["level_moved_pct"] == pytest.approx(5.07, abs=0.01)
    # predicted +40.7 ms over its model; measured 82.2 against the level (43.4 + 45.6) / 2 = 44.5: +37.7 ms
    assert row["change_error_pct"] == pytest.approx(100 * (40.7 - 37.7) / 82.2, abs=0.05)
    # the headline is the what-if's own error, the model's on the profiled job and the profiled job's departure from the level
    assert row["error_pct"] == pytest.approx(row["change_error_pct"] + 100 * (71.1 - 71.3) / 82.2 + 100 * (71.3 - 44.5) / 82.2)


def test_without_drift_or_model_error_the_change_error_is_the_absolute_one():
    exact = PROFILED | {"model_median_ms": 71.3, "model_median_pct": 0.0}
    row = _round(0, exact, OTHER, (ref(70.3), ref(72.3)))
    assert row["change_error_pct"] == pytest.approx(row["error_pct"]) and row["level_drift_pct"] == 0.0


def test_rounds_kept_without_reference_jobs_have_no_change_error():
    rounds = [_round(0, PROFILED, OTHER)]
    assert "change_error_pct" not in rounds[0]
    summary = _summary(rounds, {"rate_bit": 100e6, "other_rate_bit": 40e6, "why": "fixed (PAIRS)"})
    assert summary["change_error_pct"] == {"median": None, "spread": None} and summary["error_pct"]["median"] == pytest.approx(36.0, abs=0.1)


def test_the_settle_job_is_read_against_the_first_rounds_level():
    """A script's first job (``_settle``, judged nowhere) against round 1's references; none without it or them."""
    pair = {"rate_bit": 100e6, "other_rate_bit": 40e6, "why": "fixed (PAIRS)"}
    rounds = [_round(0, PROFILED, OTHER, (ref(43.4), ref(45.6))), _round(1, PROFILED, OTHER, (ref(90.0), ref(90.0)))]
    assert _summary(rounds, pair, ref(53.4))["settle_drift_pct"] == pytest.approx(100 * (53.4 - 44.5) / 44.5)
    assert _summary(rounds, pair)["settle_drift_pct"] is None
    assert _summary(rounds, pair, {"load": 2.0, "refused": "the loopback was shaped at 0 Mbit/s"})["settle_drift_pct"] is None
    assert _summary([_round(0, PROFILED, OTHER)], pair, ref(53.4))["settle_drift_pct"] is None


def test_the_interval_is_judged_on_the_measured_jobs_unprofiled_steps():
    """The what-if's interval is for a run's median step without the profiler (``analysis.interval``): ``in_interval`` holds
    the measured job's unprofiled median (``shaped_loopback.unprofiled_steps_us``, the steps ``bench/bench_coverage.py``
    judges by), not its profiled window's; a job that timed fewer than ``MIN_STEPS`` of them is not judged."""
    inside, outside = _round(0, PROFILED, OTHER | {"unprofiled_median_ms": 150.0}), _round(1, PROFILED, OTHER | {"unprofiled_median_ms": 160.0})
    assert inside["in_interval"] and not outside["in_interval"]  # the window's 82.2 ms is inside both
    untimed = _round(2, PROFILED, OTHER | {"unprofiled_median_ms": None})
    assert "in_interval" not in untimed and "error_pct" in untimed
    summary = _summary([inside, outside, untimed], {"rate_bit": 100e6, "other_rate_bit": 40e6, "why": "fixed (PAIRS)"})
    assert (summary["in_interval"], summary["interval_judged"]) == (1, 2)


def test_a_kept_pairs_unprofiled_median_is_what_the_interval_is_held_against():
    """hvd_sparse_gru on the testbed (tests/data/horovod/testbed-sparse-gru): profiled at 200 Mbit/s, measured at 500 Mbit/s,
    whose job ran 8 unprofiled steps past the warm-up (median 316.9 ms) and a profiled window of 361.6 ms (the profiler's cost;
    its steps replay as measured since another rank's Horovod transfer ends by its own synchronize return: 361.85 before).
    Against an interval of 300-340 ms the round is inside, where the window's median would have put it outside."""
    pair = DATA / "horovod" / "testbed-sparse-gru"
    a, b = predict_rate(str(pair / "200M"), 200e6, 500e6), measured(str(pair / "500M"))
    assert len(unprofiled_steps_us(open_run(pair / "500M").graph)) == b["unprofiled_steps"] == 8
    assert b["unprofiled_median_ms"] == pytest.approx(316.85, abs=0.01) and b["measured_median_ms"] == pytest.approx(361.60, abs=0.01)
    row = _round(0, a | {"interval_ms": [300.0, 340.0]}, b)
    assert row["in_interval"] and not 300.0 <= b["measured_median_ms"] <= 340.0


def test_each_host_gets_a_core_of_its_own_until_they_run_out():
    from bench_frameworks import host_cores  # noqa: PLC0415

    mine = sorted(os.sched_getaffinity(0))
    assert host_cores(len(mine)) == mine  # one host a core
    assert host_cores(len(mine) + 1) == [*mine, mine[0]]  # more hosts than cores: they share, in turn


def test_the_cpu_others_took_beside_a_job_is_the_busy_time_less_ours():
    from bench_frameworks import _others_cpu_pct  # noqa: PLC0415

    # over 10 s the machine was busy 14 CPU-seconds, 9 of them this bench's and its job's: others took half a core
    assert _others_cpu_pct((100.0, 500.0, 20.0), (110.0, 514.0, 29.0)) == pytest.approx(50.0)
    assert _others_cpu_pct((100.0, 500.0, 20.0), (110.0, 505.0, 29.0)) == 0.0  # ours counted as a child exits: never below 0
    row = _round(0, PROFILED | {"others_cpu_pct": 0.0}, OTHER | {"others_cpu_pct": 62.4}, (ref(43.4) | {"others_cpu_pct": 70.8}, ref(45.6)))
    assert _summary([row], {"rate_bit": 100e6, "other_rate_bit": 40e6, "why": "given"})["others_cpu_pct"] == {"median": 62.4, "spread": [0.0, 70.8]}
