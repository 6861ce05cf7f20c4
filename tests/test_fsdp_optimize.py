"""dagprof optimize and dagprof.apply for FSDP2 jobs: the search on real recordings (tests/data/fsdp), the strategy
file's FSDP plan, memory budgets, refusals, and apply + --verify on real 2-rank gloo ``fully_shard`` jobs."""
import json
import os
import sys

import pytest
from testdata import DATA, worker_results

from dagprof.cli.main import main
from dagprof.collect.deploy.strategy import FsdpPlan, FsdpUnitPlan, Strategy, load_strategy, save_strategy
from dagprof.errors import DagprofError
from dagprof.pipeline import open_run
from dagprof.search.fsdp_optimize import FsdpCandidate, FsdpEvaluator, grouping_specs, predict_fsdp, search_fsdp
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate

FSDP = DATA / "fsdp"
RESHARD4, KEEP4, KEEP_BF16 = FSDP / "reshard4", FSDP / "keep4", FSDP / "keep-bf16-prefetch"
WORKER = os.path.join(os.path.dirname(__file__), "apply_fsdp_worker.py")


def graph(path):
    return open_run(path).graph


def test_every_candidate_is_priced_and_the_profiled_setup_replays_as_measured():
    p = open_run(RESHARD4)
    res = search_fsdp(p.graph, budget_s=60)
    assert res.replayed == 2 ** 5  # 5 units (the root's too), reshard on/off each, the reduce dtype kept
    assert res.baseline.iter_us == pytest.approx(p.analysis.measured_us, rel=0.005)
    # resharding again in backward costs a second all-gather per unit: keeping every unit gathered is fastest here
    assert set(res.best.candidate.reshard) == {False} and res.best.candidate.reduce_dtype is None
    assert res.worth_applying and res.best.iter_us < res.baseline.iter_us
    assert res.best.memory.total >= res.baseline.memory.total  # ... and it costs memory
    assert any("prefetch depth not searched" in n for n in res.notes)


def test_unit_groupings_are_priced_as_the_units_whatif_prices_them():
    """Every coarser grouping once (adjacent pairs, merge:N, merge:all), each priced as ``whatif --units`` prices it
    relative to the profiled setup, with its memory; the fastest that gains and fits is advised, with its wrap call."""
    g = graph(RESHARD4)
    assert grouping_specs(g) == ["blocks.0+blocks.1", "blocks.1+blocks.2", "blocks.2+blocks.3", "merge:2", "merge:3", "merge:all"]
    res = search_fsdp(g, budget_s=60)
    assert [gr.spec for gr in res.groupings] == sorted(grouping_specs(g), key=lambda s: next(gr.iter_us for gr in res.groupings if gr.spec == s))
    rows = {r.scenario.units: r for r in evaluate(g, [Scenario(), Scenario(units="merge:2"), Scenario(units="merge:all")],
                                                  tolerance_pct=None)["scenarios"] if r.scenario.units}
    model = evaluate(g, [Scenario()], tolerance_pct=None)["scenarios"][0].predicted_iter_ms
    for gr in res.groupings:
        if gr.spec in rows:  # the same ratio to the profiled setup, and the same peak memory
            assert gr.iter_us / res.baseline.iter_us == pytest.approx(rows[gr.spec].predicted_iter_ms / model, rel=0.01)
            assert gr.memory.total / 2**20 == pytest.approx(rows[gr.spec].peak_memory_mb, rel=1e-6)
    advised = res.grouping
    assert advised is res.groupings[0] and advised.spec == "merge:all" and advised.iter_us < res.baseline.iter_us
    assert advised.wrap("fully_shard") == "fully_shard(model) with blocks.0, blocks.1, blocks.2, blocks.3 not wrapped on their own"
    assert advised.memory.total > res.baseline.memory.total  # gathering the whole model at once costs memory
    budget = search_fsdp(g, memory_budget=res.baseline.memory.total * 1.05)  # no coarser grouping fits: none advised
    assert all(not gr.fits for gr in budget.groupings if gr.memory.total > res.baseline.memory.total * 1.05)
    assert budget.grouping is None or budget.grouping.memory.total <= res.baseline.memory.total * 1.05


def test_a_space_too_large_to_replay_whole_is_walked_by_single_changes():
    g = graph(KEEP4)
    whole = search_fsdp(g, allow_lossy=True)
    walked = search_fsdp(g, allow_lossy=True, exhaustive=1)
    assert walked.replayed < whole.replayed == 2 * 2 ** 5
    assert walked.best.candidate == whole.best.candidate and walked.best.iter_us == whole.best.iter_us


def test_hsdp_units_are_searched_too():
    res = search_fsdp(graph(FSDP / "hsdp"))
    assert res.units == ["<root>", "blocks.0", "blocks.1"] and res.replayed == 2 ** 3
    assert res.strategy().fsdp.units[1].numel == 16576


def test_the_reduce_dtype_is_searched_only_when_lossy_is_allowed():
    g = graph(KEEP_BF16)  # bf16 parameters, gradients reduced in fp32
    plain = search_fsdp(g)
    assert plain.best.candidate.reduce_dtype is None and plain.replayed == 2 ** 3
    lossy = search_fsdp(g, allow_lossy=True)
    assert lossy.replayed == 2 * 2 ** 3 and lossy.best.candidate.reduce_dtype == "bfloat16"
    assert lossy.best.iter_us < plain.best.iter_us and lossy.best.memory.total < plain.best.memory.total
    st = lossy.strategy()
    assert st.lossy and "reduce in bfloat16" in st.summary() and any("lower precision" in c for c in st.caveats())


def test_a_tight_memory_budget_reshards_what_the_peak_holds():
    """KEEP4 was profiled with every unit kept gathered. At the least peak (every unit resharded) the strategy must
    reshard blocks.0 and blocks.1, whose kept parameters are alive at the peak (the backward of blocks.3); the
    root's are gathered throughout backward, blocks.2's are prefetched there and blocks.3 is the unit running, so
    keeping those costs no memory at the peak and the search keeps them (faster)."""
    g = graph(KEEP4)
    ev = FsdpEvaluator(g, [u.name for u in g.meta.fsdp.units], None)
    least = ev.score(FsdpCandidate((True,) * 5)).memory.total
    res = search_fsdp(g, memory_budget=least)
    assert not res.baseline.fits and res.best.fits and res.worth_applying  # needed to fit, though slower
    assert res.best.memory.total == least and res.best.iter_us > res.baseline.iter_us
    chosen = dict(zip(res.units, res.best.candidate.reshard))
    assert chosen["blocks.0"] and chosen["blocks.1"]
    roomy = search_fsdp(g, memory_budget=res.baseline.memory.total)
    assert roomy.best.candidate == roomy.baseline.candidate and not roomy.worth_applying


def test_an_impossible_memory_budget_is_refused_in_one_line(capsys, tmp_path):
    assert main(["optimize", str(KEEP4), "--memory-budget", "1MB", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no FSDP strategy fits 1.0 MB per rank: the least dagprof can reach is 1.4 MB with every unit resharded" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "o").exists()


def test_unsearched_knobs_are_refused_in_one_line(capsys):
    assert main(["optimize", str(KEEP4), "--accumulate", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "FSDP job; --accumulate is not searched for FSDP" in err and len(err.splitlines()) == 1


def test_cli_writes_a_version_2_strategy_and_says_what_is_not_searched(capsys, tmp_path):
    assert main(["optimize", str(RESHARD4), "--json", "-o", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fsdp"] and out["strategy_file"] and out["best"]["memory"]["total_mb"] > 0 and out["predicted_speedup"] > 1.02
    assert any("prefetch depth not searched" in n for n in out["notes"])
    d = json.load(open(out["strategy_file"]))
    assert d["version"] == 2 and d["fsdp"]["units"][0] == {"name": "<root>", "numel": 33024, "reshard_after_forward": False}
    s = load_strategy(out["strategy_file"])
    assert [u.name for u in s.fsdp.units] == ["<root>", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert {u.reshard_after_forward for u in s.fsdp.units} == {False} and s.fsdp.reduce_dtype is None
    assert "fsdp_model" in out["recommendation"]
    assert main(["optimize", str(RESHARD4), "-o", str(tmp_path / "text")]) == 0
    text = capsys.readouterr().out
    assert "reshard_after_forward" in text and "note: prefetch depth not searched" in text
    assert "unit grouping (wrap time, not in the strategy file): --units merge:all" in text and "fully_shard(model) with" in text
    assert out["unit_grouping"]["units"] == "merge:all" and out["unit_groupings_priced"] == 6


def test_fsdp_strategy_file_round_trips_and_ddp_files_stay_version_1(tmp_path):
    s = Strategy((), 2, fsdp=FsdpPlan((FsdpUnitPlan("<root>", 10, False), FsdpUnitPlan("blocks.0", 4, True)), "bfloat16"))
    assert load_strategy(save_strategy(s, tmp_path / "f.json")) == s
    assert json.load(open(tmp_path / "f.json"))["version"] == 2
    ddp = Strategy((("a.weight", 6),), 2)
    save_strategy(ddp, tmp_path / "d.json")
    d = json.load(open(tmp_path / "d.json"))
    assert d["version"] == 1 and "fsdp" not in d and load_strategy(tmp_path / "d.json") == ddp


def test_a_strategy_is_priced_on_another_profile_and_refused_on_the_wrong_one():
    s = search_fsdp(graph(RESHARD4)).strategy()
    pred, g = predict_fsdp(graph(RESHARD4), s)
    assert pred.speedup > 1.02 and g.meta.fsdp is not None
    with pytest.raises(DagprofError, match="FSDP unit 'blocks.2' is not in it"):
        predict_fsdp(graph(FSDP / "reshard"), s)  # 2 blocks


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("apply_fsdp")
    return worker_results(WORKER, out)


def test_apply_sets_reshard_per_unit_on_a_wrapped_model(applied):
    for r in applied:
        assert r["default_gathered"] == {"<root>": True, "blocks.0": False, "blocks.1": False, "blocks.2": False}
        # kept gathered between forward and backward: the units the plan keeps (the root as FSDP does)
        assert r["gathered"] == {"<root>": True, "blocks.0": True, "blocks.1": False, "blocks.2": True}
        assert r["reshard_grad_diff"] == 0.0 and r["again_same_plan"] and r["reshard_reduce_dtype"] == "None"


def test_apply_sets_the_reduce_dtype_as_the_documented_wrap_time_call_does(applied):
    for r in applied:
        assert set(r["bf16_reduce_dtype"].values()) == {"torch.bfloat16"} and r["bf16_reduce_dtype"] == r["kwargs_reduce_dtype"]
        assert r["bf16_gathered"] == r["kwargs_gathered"] == r["gathered"]
        assert 0 < r["bf16_grad_diff"] < 1e-2 and r["bf16_grad_diff"] == r["kwargs_grad_diff"]  # the same rounding either way


def test_apply_refuses_a_strategy_for_another_model_in_one_line(applied):
    for r in applied:
        assert "FSDP unit 'blocks.9' is not a fully_shard-ed module here" in r["mismatch_name"]
        assert "FSDP unit 'blocks.1' has 7 parameter elements in the strategy, 4192 here" in r["mismatch_size"]
        assert "needs the DistributedDataParallel-wrapped model" in r["ddp_strategy"]
        assert "\n" not in r["mismatch_name"] + r["mismatch_size"] + r["ddp_strategy"]


def test_optimize_verify_applies_the_strategy_to_the_real_fsdp_job(capsys, tmp_path):
    """The zero-code loop on a real job: the strategy found on KEEP4's configuration's sibling (RESHARD4, every unit
    resharded) is applied by the bootstrap at the root's first forward, and both setups are measured (1 round: this
    checks the loop, bench/bench_fsdp.py --part 6 measures the gain)."""
    pytest.importorskip("torch")
    script = DATA.parent.parent / "bench" / "fsdp_train.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           "--blocks", "4", "--width", "64", "--vocab", "256", "--batch", "4", "--seq", "16", "--steps", "8"]
    assert main(["optimize", str(RESHARD4), "--json", "-o", str(tmp_path), "--verify", "--rounds", "1", "--"] + cmd) == 0
    v = json.loads(capsys.readouterr().out)["verification"]
    assert v["rounds"] == 1 and v["measured_speedup"] > 0 and len(v["predicted_speedup_per_round"]) == 1
    assert v["predicted_change"].startswith("keeps <root>, blocks.0, blocks.1, blocks.2, blocks.3 gathered after forward: 5 backward")
    kept = {u.name: u.reshard_after_forward for u in graph(v["strategy_runs"][0]).meta.fsdp.units}
    default = {u.name: u.reshard_after_forward for u in graph(v["baseline_runs"][0]).meta.fsdp.units}
    assert set(kept.values()) == {False} and set(default.values()) == {True}


def test_the_predicted_graph_says_what_the_plan_changed():
    """The graph a keep-gathered plan predicts is that setup's (its units kept, no backward all-gathers), so comparing it
    with the kept run names no layout difference where it once said "expected none" kept; and the explanation names the
    units, the all-gathers removed and their bytes (``fsdp/keep4`` is ``fsdp/reshard4``'s job with every unit kept)."""
    from dagprof.analysis.diff import categories_vs_expected
    from dagprof.search.fsdp_optimize import plan_change

    g = graph(RESHARD4)
    plan = FsdpPlan(tuple(FsdpUnitPlan(u.name, u.numel, False) for u in g.meta.fsdp.units))
    strategy = Strategy((), 2, fsdp=plan)
    _, predicted = predict_fsdp(g, strategy)
    assert not any(u.resharded_after_forward for u in predicted.meta.fsdp.units)
    notes = categories_vs_expected(predicted, open_run(KEEP4)).diff.notes
    assert not [n for n in notes if n.startswith("FSDP")], notes
    assert plan_change(g, strategy) == ("keeps <root>, blocks.0, blocks.1, blocks.2, blocks.3 gathered after forward: 5 backward "
                                        "all-gathers a step removed (388.0 KB gathered, 7.12 ms of transfer as profiled), with their "
                                        "copy-outs and the forward reshards")
    one = Strategy((), 2, fsdp=FsdpPlan(tuple(FsdpUnitPlan(u.name, u.numel, u.name != "blocks.1") for u in g.meta.fsdp.units), "bfloat16"))
    assert plan_change(g, one).startswith("keeps blocks.1 gathered after forward: 1 backward all-gather a step removed (64.8 KB gathered")
    assert plan_change(g, one).endswith("; reduces every unit's gradients in bfloat16")


def test_settings_that_stand_beside_an_advised_grouping_say_the_grouping():
    """keep4 keeps every unit gathered already: no setting a strategy file holds gains, yet merging its units does. The
    one line said instead of a strategy named the job's settings as standing under a line advising the grouping
    (bench/fsdp_fresh/hsdp_pointnet2.py: merge:3 at -6.4 %); it now names the grouping and its wrap call."""
    from dagprof.closeloop import defaults_stand

    res = search_fsdp(graph(KEEP4), budget_s=60)
    assert not res.worth_applying and res.grouping is not None
    line = defaults_stand(res)
    assert "settings stand" not in line and "no strategy file written" in line
    assert f"--units {res.grouping.spec}" in line and res.grouping.wrap(res.api) in line
