"""``dagprof optimize`` and ``dagprof.apply`` on FSDP2 jobs of several ``fully_shard`` roots (a GAN's generator and
discriminator, an actor-critic): each root's units searched root by root, the peak under ``--memory-budget`` taken
phase by phase (``search.fsdp_memory.root_phases``), groupings within a root only, and a strategy deployed on every
root, by the user's list or as ``--verify`` reaches each root."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from testdata import DATA, worker_results

from dagprof.cli.main import main
from dagprof.collect.deploy.strategy import FsdpPlan, FsdpUnitPlan, Strategy, load_strategy, save_strategy
from dagprof.graph.build import build_graph
from dagprof.passes.fsdp import set_reshard
from dagprof.search.fsdp_memory import fsdp_peak
from dagprof.search.fsdp_optimize import grouping_specs, search_fsdp
from dagprof.search.optimize import TIE_PCT
from dagprof.traces.dagprof_run import read_run

GAN, A2C = DATA / "fsdp-fresh" / "gan-roots", DATA / "fsdp-fresh" / "a2c-roots"
WORKER = os.path.join(os.path.dirname(__file__), "apply_roots_worker.py")


@pytest.fixture(scope="module")
def gan():
    return build_graph(read_run(GAN))


@pytest.fixture(scope="module")
def a2c():
    return build_graph(read_run(A2C))


def test_each_root_is_searched_with_the_others_at_their_best(gan):
    res = search_fsdp(gan, budget_s=120)
    units = gan.meta.fsdp.units
    # root by root: 2^4 + 2^3 settings a round (the GAN's Sequential roots have no unit of their own), not 2^7
    assert res.replayed < 2 ** len(units) and any("2 fully_shard roots" in n for n in res.notes)
    plan = res.strategy().fsdp
    assert plan.roots == 2 and [u.root for u in plan.units] == [u.root for u in units]
    assert [u.name for u in plan.of_root(1).units] == ["FSDPSequential1.0", "FSDPSequential1.1", "FSDPSequential1.2"]
    # no single change of one unit beats the best (a local optimum of the whole space, each candidate replayed whole)
    best = res.best.candidate.reshard
    for k in range(len(best)):
        flipped = dict(zip(res.units, best)) | {res.units[k]: not best[k]}
        assert res.best.iter_us <= _iter_us(gan, flipped) * (1 + TIE_PCT / 100)


def _iter_us(g, mapping) -> float:
    from dagprof.analysis import job_iteration_us
    from dagprof.replay import replay

    sg = set_reshard(g, mapping)
    return job_iteration_us(sg, replay(sg))


def test_a_memory_budget_is_judged_by_the_roots_phases(gan):
    """Under a budget the kept-gathered best may not fit, each candidate's peak is the phase model's (each root's
    activations while the profile had them alive), and the plan chosen fits it."""
    free = search_fsdp(gan, budget_s=120)
    assert free.best.memory.total > free.baseline.memory.total  # keeping units gathered costs memory
    budget = (free.best.memory.total + free.baseline.memory.total) / 2
    res = search_fsdp(gan, budget_s=120, memory_budget=budget)
    assert res.best.fits and res.best.memory.total <= budget
    peak = max(fsdp_peak(gan, reshard=dict(zip(res.units, res.best.candidate.reshard))).values(), key=lambda m: m.total)
    assert peak.total == res.best.memory.total


def test_groupings_stay_within_a_root_and_name_each_roots_modules(gan):
    specs = grouping_specs(gan)
    assert "3+FSDPSequential1.0" not in specs and "FSDPSequential1.0+FSDPSequential1.1" in specs
    res = search_fsdp(gan, budget_s=120)
    wraps = {gr.spec: gr.wrap("fully_shard") for gr in res.groupings}
    assert wraps["FSDPSequential1.0+FSDPSequential1.1"] == ("fully_shard([root1.0, root1.1]) (root1: the fully_shard root whose "
                                                             "unit names begin FSDPSequential1)")
    assert wraps["0+1"] == "fully_shard([model.0, model.1])"


def test_optimize_writes_a_strategy_of_every_root_and_says_how_to_apply_it(tmp_path, capsys):
    copy = shutil.copytree(A2C, tmp_path / "a2c")
    assert main(["optimize", str(copy), "--json", "--budget", "60", "-o", str(tmp_path / "out")]) == 0
    doc = json.loads(capsys.readouterr().out)
    s = load_strategy(doc["strategy_file"])
    assert s.fsdp.roots == 2 and "dagprof.apply([root0, root1]" in doc["recommendation"]


def test_a_one_root_strategy_file_keeps_its_shape(tmp_path):
    """The root index is written only where it is not the first root's: strategies of one root are unchanged."""
    path = save_strategy(Strategy((), 2, fsdp=FsdpPlan((FsdpUnitPlan("blocks.0", 3, False),))), tmp_path / "s.json")
    assert '"root"' not in open(path).read() and load_strategy(path).fsdp.roots == 1


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("apply_roots")
    return worker_results(WORKER, out)


def test_apply_configures_each_root_as_the_plan_says(applied):
    for r in applied:
        assert r["default"] == {"0:0": False, "0:1": False, "0:2": False, "1:": True, "1:blocks.0": False, "1:blocks.1": False}
        want = {"0:0": True, "0:1": False, "0:2": True, "1:": True, "1:blocks.0": False, "1:blocks.1": True}
        assert r["applied"] == r["by_root_gathered"] == want and r["again_same_plan"] and r["by_root"] == [True, True]
        assert r["one_root_leaves_the_second"]


def test_apply_refuses_what_it_cannot_deploy_in_one_line(applied):
    for r in applied:
        assert "configures 2 fully_shard roots, dagprof.apply was given 1: pass every root" in r["one_module"]
        assert "the module given as root 0 (FSDPCritic) is this strategy's root 1: pass the roots in the order the job first runs " \
               "them forward" in r["swapped"]
        assert "this is a DDP strategy" in r["ddp_list"]
        assert "\n" not in r["one_module"] + r["swapped"] + r["ddp_list"]
