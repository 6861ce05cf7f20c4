"""Every prediction carries an interval (issue 20): the one object, its arithmetic, and its place in whatif and optimize."""
import json
from dataclasses import replace

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis import job_iteration_us
from dagprof.analysis.interval import (
    BOOTSTRAP,
    PredictionInterval,
    RunLevel,
    _t_quantile,
    compute_floor,
    compute_pace,
    link_residuals,
    median_spread,
    predict_interval,
    run_level,
    step_times,
    typical_iteration_us,
)
from dagprof.cli.main import main
from dagprof.closeloop import find_strategy
from dagprof.collect.hooks.steptimes import WARMUP_FRACTION, read_times
from dagprof.graph.meta import LoopSteps
from dagprof.passes import fit_topology, set_link, set_topology
from dagprof.passes.profiler_cost import measure_profiler_cost, median_stderr, window_sides
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.search.optimize import Options
from dagprof.traces.events import Kind
from dagprof.traces.meta import StepSched


def test_text_and_bounds():
    p = PredictionInterval(1_417_000.0, 1_380_000.0, 1_452_000.0)
    assert p.text() == "1,417 ms (1,380-1,452, 90 %)"
    assert PredictionInterval(6_290.0, 5_100.0, 7_480.5).text() == "6.29 ms (5.10-7.48, 90 %)"
    assert p.contains(1_380_000.0) and p.contains(1_452_000.0) and not p.contains(1_452_001.0)
    half = p.scaled(0.5)
    assert (half.point_us, half.lo_us, half.hi_us, half.level) == (708_500.0, 690_000.0, 726_000.0, 0.9)
    d = p.to_dict()
    assert (d["predicted_iter_ms"], d["lo_ms"], d["hi_ms"], d["level"]) == (1417.0, 1380.0, 1452.0, 0.9)


@pytest.mark.parametrize("dof,t", [(1, 6.314), (2, 2.920), (3, 2.353), (4, 2.132), (7, 1.895), (30, 1.697)])
def test_student_t_quantiles(dof, t):
    assert _t_quantile(0.95, dof) == pytest.approx(t, rel=0.01)
    assert _t_quantile(0.05, dof) == pytest.approx(-t, rel=0.01)


def test_each_replayed_step_is_the_measured_one():
    """One time per step, the slowest rank's: their mean is at least the slowest rank's mean (the iteration time)."""
    prof = open_run(DATA / "gloo-windows" / "same")
    d = step_times(prof.graph, prof.analysis.result)
    assert len(d) == len(prof.graph.meta.steps) == 3
    assert prof.analysis.predicted_us <= d.mean() <= prof.analysis.predicted_us * 1.01


def test_the_typical_step_is_the_median_step_as_measured():
    """The optimizer prices the median of the replayed steps (the slowest rank's each), as ``iteration_ms`` measures the
    job: one step stalled by a neighbour (a real PowerSGD round's defaults, 5 steps) moves the mean, not the median."""
    g = open_run(DATA / "powersgd-2bucket" / "defaults").graph
    res = replay(g)
    d = step_times(g, res)
    assert len(d) == 5 and typical_iteration_us(g, res) == pytest.approx(float(np.median(d)))
    slowest = int(np.argmax(d))
    step = sorted(set(g.step[g.step >= 0].tolist()))[slowest]
    one = np.flatnonzero((g.step == step) & (g.rank == 0) & (g.dur > 0) & (g.kind == Kind.BACKWARD))[0]
    stalled = g.replace(dur=g.dur.copy())
    stalled.dur[one] += 200_000.0
    again = replay(stalled)
    assert job_iteration_us(stalled, again) > job_iteration_us(g, res) + 30_000.0  # the mean spreads it over every step
    assert typical_iteration_us(stalled, again) == pytest.approx(typical_iteration_us(g, res), rel=1e-6)


def test_interval_holds_the_point_and_widens_with_link_residuals():
    g = open_run(DATA / "gloo-windows" / "same").graph
    modelled = set_topology(g, fit_topology(g))
    r = link_residuals(g, modelled)
    assert len(r) == 3 and np.all(r > 0)
    res = replay(modelled)
    plain = predict_interval(modelled, res)
    widened = predict_interval(modelled, res, residuals=r)
    assert plain.lo_us <= plain.point_us <= plain.hi_us
    assert widened.residual_steps == 3 and plain.residual_steps == 0
    assert widened.lo_us <= plain.lo_us and widened.hi_us >= plain.hi_us
    slow = set_link(modelled, bandwidth=1e6)  # communication dominates: the residuals matter more
    wide_slow = predict_interval(slow, replay(slow), residuals=r)
    assert (wide_slow.hi_us - wide_slow.point_us) / wide_slow.point_us > (widened.hi_us - widened.point_us) / widened.point_us


def test_the_level_widens_after_the_spreads():
    """Spreads in quadrature (the standard error at the normal quantile), a shift added to its own side only."""
    p = PredictionInterval(100.0, 90.0, 110.0, terms=("steps",))
    w = p.widened(RunLevel(shift=0.05, stderr=0.02, drift=0.03, terms=("profiler_cost", "drift")))
    spread = np.sqrt(0.1**2 + (1.6449 * 0.02) ** 2 + (1.6449 * 0.03) ** 2)
    assert w.point_us == 100.0 and w.lo_us == pytest.approx(100 * (1 - spread), rel=1e-4)
    assert w.hi_us == pytest.approx(100 * (1 + spread + 0.05), rel=1e-4)
    assert w.to_dict()["interval_basis"]["terms"] == ["steps", "profiler_cost", "drift"]
    assert w.scaled(0.5).terms == w.terms
    down = p.widened(RunLevel(shift=-0.05, terms=("model",)))
    assert (down.lo_us, down.hi_us) == pytest.approx((85.0, 110.0))
    assert p.widened(RunLevel()) is p  # nothing measured: as it was


def _loop(g, profiled: float, unprofiled: float):
    """``g`` with its loop timing the profiled steps at ``profiled`` x the measured step and 6 later ones at ``unprofiled`` x."""
    m = g.meta.measured_iter_us
    jitter = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0]
    loop = LoopSteps({r: {s: m[r] * profiled * jitter[i] for i, s in enumerate(g.meta.steps)} for r in m},
                     {r: {s: m[r] * unprofiled * jitter[i] for i, s in enumerate(range(10, 16))} for r in m})
    return g.replace(meta=g.meta.replace(loop_steps=loop))


def test_run_level_from_the_profile():
    """The unprofiled steps' offset is a shift only where the profiler's cost was not removed; its standard error
    widens both ways either way; the model's miss of the profiled run compounds with it."""
    g = open_run(DATA / "gloo-windows" / "same").graph
    cost = measure_profiler_cost(g)
    assert run_level(g, cost, False) == RunLevel()  # a stock trace: no unprofiled steps
    slower = _loop(g, 1.0, 0.9)  # the profiler cost 10 %
    cost = measure_profiler_cost(slower)
    assert cost.usable
    raw = run_level(slower, cost, False)
    fixed = run_level(slower, cost, True)
    assert raw.terms == fixed.terms == ("profiler_cost", "unprofiled_steps") and raw.drift == fixed.drift == 0.0  # nothing before the window
    after = [m * 0.9 * j for m in [max(g.meta.measured_iter_us.values())] for j in (1.0, 1.01, 0.99, 1.02, 0.98, 1.0)]
    assert raw.unprofiled == pytest.approx(median_spread(after)) and 0.01 < raw.unprofiled < 0.03
    assert raw.shift == pytest.approx(cost.unprofiled_us / cost.profiled_us - 1) and fixed.shift == 0.0
    assert raw.stderr == fixed.stderr == pytest.approx(cost.stderr_us / cost.profiled_us) and fixed.stderr > 0
    both = run_level(slower, cost, True, model_us=100.0, reference_us=103.0)  # the model gives the profiled run 3 % too little
    assert both.terms == ("profiler_cost", "model", "unprofiled_steps") and both.shift == pytest.approx(0.03)
    assert run_level(slower, cost, False, 100.0, 103.0).shift == pytest.approx((1 + raw.shift) * 1.03 - 1)


def test_the_unprofiled_floor_counts_neither_the_drift_nor_the_level_s_error_twice():
    """The job's unprofiled steps around the window bound each side from below with the spread of a run's median. Where
    they moved across the window (here +20 % after it), the drift term carries that move, so the floor is the spread of
    the two sides brought together by it; and where the profiler's cost is measured, its standard error holds the
    unprofiled median's own error, so the floor keeps only the run's median's part of its interval (with a run as long as
    the steps, the two parts are equal: 1 / sqrt(2) of it)."""
    g = open_run(DATA / "gloo-windows" / "same").graph  # profiled steps 2-4
    m = g.meta.measured_iter_us
    jitter = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0]
    before = {-2: 1.0, -1: 1.0, 0: 1.0, 1: 1.02}  # -2, -1: the warm-up
    after = {s: 1.2 * jitter[i] for i, s in enumerate(range(5, 11))}
    loop = LoopSteps({r: {s: m[r] * jitter[i] for i, s in enumerate(g.meta.steps)} for r in m},
                     {r: {s: m[r] * x for s, x in (before | after).items()} for r in m})
    moved = g.replace(meta=g.meta.replace(loop_steps=loop))
    level = run_level(moved, measure_profiler_cost(moved), False)
    assert level.drift > 0.15 and "drift" in level.terms
    slowest = max(m.values())
    # step 5, the first after the window, as the rank that began it last timed it (``profiler_cost.job_steps``): the least
    sides = [slowest * before[s] for s in (0, 1)], [(min(m.values()) if s == 5 else slowest) * x for s, x in after.items()]
    change = np.median(sides[1]) - np.median(sides[0])
    shift = change * np.sqrt(1 - (np.hypot(*(median_stderr(x) for x in sides)) / change) ** 2)
    together = [x + shift / 2 for x in sides[0]] + [x - shift / 2 for x in sides[1]]
    assert level.unprofiled == pytest.approx(median_spread(together)) and level.unprofiled < median_spread(sides[0] + sides[1]) / 3
    assert level.unprofiled_own == pytest.approx(level.unprofiled / np.sqrt(2))
    p = PredictionInterval(100.0, 99.0, 101.0, terms=("steps",))
    floor = RunLevel(unprofiled=0.1, unprofiled_own=0.1 / np.sqrt(2), terms=("unprofiled_steps",))
    assert p.widened(floor).hi_us == pytest.approx(110.0)  # no cost measured: the whole interval of the unprofiled steps
    costed = p.widened(replace(floor, stderr=0.02, terms=("profiler_cost", "unprofiled_steps")))
    assert costed.hi_us == pytest.approx(100 * (1 + np.hypot(0.1 / np.sqrt(2), 1.6448536 * 0.02)))


def test_one_step_has_no_step_spread():
    g = open_run(DATA / "gloo-windows" / "same", steps=range(2, 3)).graph
    p = predict_interval(g, replay(g))
    assert p.steps <= 1 and p.lo_us == p.hi_us == p.point_us


def _json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_whatif_rows_carry_both_bounds(capsys):
    run = str(DATA / "gloo-windows" / "same")
    for template in ([], ["--template"]):
        # --template: the averaged replay of these three steps misses the measured run by 8.5 % (not the link model's
        # doing); the bounds are this test's point
        r = _json(capsys, "whatif", run, "--bandwidth", "1Gbit,100Mbit", "--no-trace", *(template and [*template, "--allow-model-error"]))
        for row in r["scenarios"]:
            assert row["lo_ms"] <= row["predicted_median_ms"] <= row["hi_ms"] and row["level"] == 0.9
            assert row["interval"].startswith(f"{row['predicted_median_ms']:,.1f} ms (") and row["interval"].endswith(", 90 %)")
            assert row["hi_ms"] > row["lo_ms"]  # three steps with their own times, and modelled communication
        assert "lo_ms" in r["columns"] and "hi_ms" in r["columns"]
    r = _json(capsys, "whatif", run, "--bandwidth", "1Gbit", "--no-trace")  # the link model within 2 % (passes.link_fit: stalls)
    assert main(["whatif", run, "--bandwidth", "1Gbit", "--no-trace"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # wherever the terminal's width folds the row
    assert f"median step {r['scenarios'][0]['interval'].split(' (')[0]} (" in text and ", 90 %)" in text


def test_whatif_interval_stands_around_the_median_step(capsys):
    """The interval is for a run's median step, so it stands around the replayed steps' median, not their mean: a real
    Horovod testbed job's 10 steps, one stalled (949 ms among 588-649), replay a mean 4 % above their median. Before, the
    interval stood around the mean (the benches held it against a run's median)."""
    run = DATA / "horovod" / "testbed-sparse-gru" / "200M"
    r = _json(capsys, "whatif", str(run), "--no-trace", "--raw", "--allow-model-error")
    row = r["scenarios"][0]
    g = open_run(run).graph
    d = step_times(g, replay(g))
    assert row["predicted_median_ms"] == pytest.approx(float(np.median(d)) / 1e3, rel=0.02)
    assert row["predicted_iter_ms"] == pytest.approx(r["model_iter_ms"], rel=1e-6)  # the mean: the model's check and the speedups
    assert row["predicted_median_ms"] < row["predicted_iter_ms"]
    assert row["lo_ms"] <= row["predicted_median_ms"] <= row["hi_ms"]


def test_optimize_json_gives_the_strategy_interval(capsys, small_ddp_run, tmp_path):
    r = _json(capsys, "optimize", small_ddp_run, "--budget", "2", "-o", str(tmp_path))
    for key in ("baseline", "best"):
        s = r[key]
        assert s["lo_ms"] <= s["predicted_iter_ms"] <= s["hi_ms"] and s["level"] == 0.9
        assert s["interval_basis"]["steps"] == 4
        assert {"steps", "model"} <= set(s["interval_basis"]["terms"])  # the search's model checked on the measured run
    assert main(["optimize", small_ddp_run, "--budget", "1", "-o", str(tmp_path)]) == 0
    assert "predicted " in capsys.readouterr().out


KEPT = DATA / "kept-optimize"


def _verified_runs(kept) -> list[list[float]]:
    """Per verification round's run of the defaults, each step past the warm-up as the slowest rank's (us), as
    ``bench/bench_coverage.py`` reads them."""
    out = []
    for folder in sorted((kept / "verify").iterdir()):
        per_rank = read_times(str(folder))
        n = min(len(r["step_s"]) for r in per_rank)
        out.append([1e6 * max(r["step_s"][i] / max(r["micro_batches"][i], 1) for r in per_rank) for i in range(min(int(n * WARMUP_FRACTION), n - 1), n)])
    return out


def test_median_spread_is_the_bootstrap_error_of_two_runs_medians():
    """On a real recording's replayed steps (a PowerSGD round's defaults, 5 steps, one stalled): Student-t on the bootstrap
    standard error of their median, times sqrt(1 + n / runs) for the measured run's own median; narrower than the
    interval one more single step gets (their t interval), and narrower still against a longer run."""
    g = open_run(DATA / "powersgd-2bucket" / "defaults").graph
    d = step_times(g, replay(g))
    n, med = len(d), float(np.median(d))
    boot = np.median(d[np.random.default_rng(0).integers(0, n, (BOOTSTRAP, n))], axis=1)
    assert median_spread(d) == pytest.approx(_t_quantile(0.95, n - 1) * np.std(boot, ddof=1) / med * np.sqrt(2))
    assert median_spread(d) == median_spread(list(d))  # seeded: the same steps, the same interval
    one_step = _t_quantile(0.95, n - 1) * np.std(d, ddof=1) / np.mean(d) * np.sqrt(1 + 1 / n)
    assert 0 < median_spread(d, runs=100) < median_spread(d) < one_step
    assert median_spread(d, runs=100) == pytest.approx(median_spread(d) * np.sqrt((1 + n / 100) / 2))
    assert median_spread([100.0]) == 0.0 and median_spread([100.0, 100.0]) == 0.0  # one step, or no spread


def test_a_measured_profiler_cost_carries_the_point_s_own_error():
    """The replayed steps' median (a kept run's 8 profiled steps) enters the step term twice: its own error and the measured
    run's. Where the profiler's cost is measured, the point stands on the unprofiled steps' level and the cost's
    standard error (both medians') takes the place of the first; a level without it (the model's miss alone) keeps it."""
    g = open_run(KEPT / "quiet-embed" / "run").graph
    p = predict_interval(g, replay(g))
    d = step_times(g, replay(g))
    assert p.point_own == pytest.approx(median_spread(d) / np.sqrt(2)) and p.point_own > 0
    z = 1.6448536
    costed = p.widened(RunLevel(stderr=0.004, terms=("profiler_cost",)))
    side = p.hi_us / p.point_us - 1
    assert costed.hi_us / costed.point_us - 1 == pytest.approx(np.sqrt(side**2 - p.point_own**2 + (z * 0.004) ** 2))
    assert costed.hi_us < p.hi_us and costed.lo_us > p.lo_us  # the cost's error is smaller than the replayed median's here
    modelled = p.widened(RunLevel(shift=0.01, terms=("model",)))
    assert modelled.hi_us / modelled.point_us - 1 == pytest.approx(side + 0.01)


def test_the_link_term_is_the_fit_s_error_not_its_bias():
    """The link residuals (a real gloo run's 3 steps, measured over the fitted link) widen by the same statistic as the
    steps (``median_spread``, relative to their median): the same residuals scaled by a constant (the model's bias on
    the profiled run, which ``run_level``'s model term carries) widen alike, and residuals that agree widen nothing."""
    g = open_run(DATA / "gloo-windows" / "same").graph
    modelled = set_topology(g, fit_topology(g))
    r = link_residuals(g, modelled)
    res = replay(modelled)
    widened, biased = predict_interval(modelled, res, residuals=r), predict_interval(modelled, res, residuals=1.5 * r)
    assert (widened.lo_us, widened.hi_us) == pytest.approx((biased.lo_us, biased.hi_us))
    plain = predict_interval(modelled, res)
    assert widened.hi_us > plain.hi_us and predict_interval(modelled, res, residuals=np.full(3, 1.3)).hi_us == plain.hi_us


@pytest.mark.parametrize("kept,medians,steps", [("loaded-embed", 3, 33), ("quiet-embed", 5, 48)])
def test_kept_runs_medians_against_the_interval(kept, medians, steps, tmp_path):
    """Two kept ``bench_optimize.py --keep`` runs (2 ranks, ``bench/ddp_heldout_embed.py``, 200 Mbit/s), the interval for the
    defaults' median step from the searched profile against each later verification run's median step (as ``--verify``
    and ``bench/bench_coverage.py`` judge it). Quiet (load 1.4-1.9): 273 ms (269-278), 5 of 6 runs' medians inside
    (271.6-278.4 ms; the last just above). Loaded (load 2.9-3.8): 284 ms (259-305), 3 of 4 inside: the last ran at
    311.0 ms, the machine's level moved after the profile by more than anything the profile measures. Single
    steps spread wider than a run's median: 33 of 44 and 48 of 66 inside (27 and 49 before the first step after the window
    was joined as its later rank timed it, ``profiler_cost.job_steps``: the loaded run's interval 269-299). In both, the 6 unprofiled steps around the
    window (2 before, 4 after) give a run's median a wider interval than the 8 replayed steps do (each the run's median's
    part: both medians' own errors are the profiler cost's), and bound each side from below."""
    g = open_run(KEPT / kept / "run").graph
    plain = predict_interval(g, replay(g))
    level = run_level(g, measure_profiler_cost(g), False)
    before, after = window_sides(g.meta.loop_steps, g.meta.steps, g.meta.job_of)
    assert len(before) == 2 and len(after) == 4 and level.unprofiled <= median_spread(before + after)  # less the drift it carries
    floored, unfloored = plain.widened(level), plain.widened(replace(level, unprofiled=0.0, unprofiled_own=0.0))
    least = np.sqrt(level.unprofiled**2 - level.unprofiled_own**2)  # the run's part: their median's own error is the cost's too
    assert floored.hi_us > unfloored.hi_us and floored.lo_us < unfloored.lo_us and floored.floor == pytest.approx(least)
    found = find_strategy(str(KEPT / kept / "run"), Options(budget_s=1, seed=0, link_model=str(KEPT / kept / "link.json")), str(tmp_path))
    iv = found.search.intervals["baseline"]
    assert "unprofiled_steps" in iv.terms and min(iv.hi_us / iv.point_us - 1, 1 - iv.lo_us / iv.point_us) >= least
    runs = _verified_runs(KEPT / kept)
    assert sum(iv.contains(float(np.median(r))) for r in runs) == medians and len(runs) == (4 if kept == "loaded-embed" else 6)
    assert sum(iv.contains(t) for r in runs for t in r) == steps


def test_the_low_end_is_never_below_the_compute_alone():
    """A Horovod what-if whose run's unprofiled steps spread +-104 % gave an interval from 0.00 ms: spreads that wide are
    cut at the replay with every collective free (``compute_floor``) at the pace of the profile's fastest step, and the
    interval says so."""
    p = open_run(str(DATA / "horovod" / "fused"))
    g, res = p.graph, p.analysis.result
    point = job_iteration_us(g, res)
    floor = compute_floor(g, res)
    d = step_times(g, res)
    assert 0.0 < floor < 1.0
    wide = predict_interval(g, res, point, run=RunLevel(unprofiled=1.04, terms=("unprofiled_steps",)))
    assert wide.lo_us == pytest.approx(point * floor * np.min(d) / np.median(d)) and "compute_floor" in wide.terms
    assert wide.hi_us > 2 * point
    assert predict_interval(g, res, point).terms == ("steps", "compute_floor")  # its 3 steps alone spread +-53 %: cut too
    narrow = PredictionInterval(point, 0.9 * point, 1.1 * point)
    assert narrow.at_least(point * floor) == narrow


def test_widening_keeps_the_compute_floor_already_set():
    """optimize widens the search's intervals by the run's level after ``predict_interval`` cut them at the compute floor:
    on the FSDP2 U-Net (bench/fsdp_fresh/unet_dcp.py, a noisy window) the low end fell to 0.00 ms. It stays at the floor."""
    cut = PredictionInterval(100.0, 90.0, 200.0, terms=("steps", "compute_floor"))
    wide = cut.widened(RunLevel(drift=0.8, terms=("drift",)))
    assert wide.lo_us == 90.0 and wide.hi_us > 200.0
    assert PredictionInterval(100.0, 90.0, 200.0, terms=("steps",)).widened(RunLevel(drift=0.8, terms=("drift",))).lo_us < 90.0


def test_the_level_s_spreads_follow_each_graph_s_compute():
    """The level's spreads are the job's CPU moving, measured as shares of the profiled step: an optimizer strategy whose
    step is mostly compute (PowerSGD where the profiled step was mostly wire) takes them by its own compute share over the
    profiled one's (``compute_floor``, which ``predict_interval`` keeps); the shift (the model's miss) stays as measured."""
    level = RunLevel(shift=0.02, stderr=0.01, drift=0.03, unprofiled=0.04, unprofiled_own=0.02, terms=("profiler_cost", "model", "drift"))
    tripled = level.for_compute(0.9, 0.3)
    assert (tripled.shift, tripled.terms) == (0.02, level.terms)
    assert (tripled.stderr, tripled.drift, tripled.unprofiled, tripled.unprofiled_own) == pytest.approx((0.03, 0.09, 0.12, 0.06))
    assert level.for_compute(0.5, 0.5) == level and level.for_compute(0.0, 0.5) == level and level.for_compute(0.5, 0.0) == level
    p = open_run(str(DATA / "horovod" / "fused"))
    assert predict_interval(p.graph, p.analysis.result).compute_share == compute_floor(p.graph, p.analysis.result) > 0


def _paced(stretch: list[float]) -> LoopSteps:
    """Two ranks' steps 0..n-1 (0-1 the warm-up), steps 4-7 profiled, each rank's training thread at ``stretch`` (its CPU
    10 ms, its waits for a core the rest)."""
    sched = {r: {s: StepSched(s, 10_000.0, 10_000.0 * (x - 1.0)) for s, x in enumerate(stretch)} for r in (0, 1)}
    profiled = {r: {s: 1e5 for s in range(4, 8)} for r in (0, 1)}
    unprofiled = {r: {s: 1e5 for s in range(len(stretch)) if not 4 <= s < 8} for r in (0, 1)}
    return LoopSteps(profiled, unprofiled, sched)


def test_the_compute_pace_is_the_steps_stretch_about_its_median():
    """How far the job's compute went below and above its median pace step to step, profiled steps and not, past the
    warm-up: the training threads' CPU plus their waits for a core over their CPU, at the interval's level."""
    stretch = [9.0, 9.0] + [1.0, 1.5, 2.0, 2.0, 2.0, 2.0, 2.5, 3.0, 4.0, 2.0]  # the warm-up's 9.0 left out
    below, above = compute_pace(_paced(stretch))
    lo, mid, hi = np.quantile(stretch[2:], [0.05, 0.5, 0.95])
    assert (below, above) == pytest.approx((1 - lo / mid, hi / mid - 1)) and below < 0.5 < above
    assert compute_pace(_paced([9.0, 9.0, 1.0, 2.0, 3.0, 4.0])) == (0.0, 0.0)  # 4 steps past the warm-up: not measured
    assert compute_pace(LoopSteps(_paced(stretch).profiled, _paced(stretch).unprofiled)) == (0.0, 0.0)  # no waits recorded


def test_the_compute_pace_widens_the_compute_beyond_the_profiled_share():
    """The pace moves the compute a graph holds beyond the profiled setup's share (``RunLevel.for_compute``: the optimizer's
    intervals; the profiled setup's own level terms hold its own), each side by its own quantile; whatif's level (never
    given a share) and the profiled setup's interval leave it out."""
    level = RunLevel(pace=(0.2, 0.5), terms=("unprofiled_steps",))
    p = PredictionInterval(100.0, 95.0, 105.0)
    assert p.widened(level) == p.widened(replace(level, pace=(0.0, 0.0)))
    assert level.for_compute(0.2, 0.2).compute == 0.0 and level.for_compute(0.1, 0.2).terms == level.terms
    paced = level.for_compute(0.8, 0.2)
    assert paced.compute == pytest.approx(0.6) and paced.terms == ("unprofiled_steps", "compute_pace")
    w = p.widened(paced)
    assert w.lo_us == pytest.approx(100 - 100 * np.hypot(0.05, 0.6 * 0.2)) and w.hi_us == pytest.approx(100 + 100 * np.hypot(0.05, 0.6 * 0.5))
    assert RunLevel(terms=("drift",)).for_compute(0.8, 0.2).terms == ("drift",)  # no pace measured: no term


def test_the_compute_floor_stands_at_the_compute_s_fastest_pace():
    """A cut at the compute floor (the profile's fastest step's pace) is lowered to the compute pace's low quantile where
    the pace applies: a wire-bound profile's steps barely outpace their median while its compute did."""
    cut = PredictionInterval(100.0, 90.0, 200.0, terms=("steps", "compute_floor"))
    level = RunLevel(drift=0.8, pace=(0.3, 0.1), terms=("drift",))
    assert cut.widened(level).lo_us == 90.0  # no compute beyond the profiled share: the floor as set
    assert cut.widened(level.for_compute(0.8, 0.4)).lo_us == pytest.approx(90.0 * 0.7)
