"""Damaged inputs that read with exit 0 and no word, or were refused naming neither file nor problem, before
(``bench/damage_67.py`` sweeps them): one check per fix. Every damaged copy is made here from a vendored file
(``powersgd-ctr``: the CTR ranker's profile and the codec costs its ``optimize --allow-lossy`` run wrote;
``ddp-fresh/gat-log-1g``: the GAT under ``find_unused_parameters=True``, profiled at 1 Gbit/s)."""
from __future__ import annotations

import json
import math
import shutil

import pytest
from testdata import DATA, cli_json, copy_fixture

from dagprof.costmodel.codecs import CodecCosts, this_machine
from dagprof.errors import DagprofError
from dagprof.passes.gradients import gradient_order
from dagprof.pipeline import open_run
from dagprof.search.measured import codec_costs

CTR = DATA / "powersgd-ctr"


def _first_psgd(d: dict) -> dict:
    return next(iter(next(iter(d["powersgd"].values())).values()))


@pytest.mark.parametrize(("damage", "said"), [
    (lambda d: d["encode_us_per_byte"].update(fp16=math.nan), "Expected `float` >= 0.0 - at `$.encode_us_per_byte[...]`"),
    (lambda d: d["decode_us_per_byte"].update(bf16=-3.0), "Expected `float` >= 0.0 - at `$.decode_us_per_byte[...]`"),
    (lambda d: _first_psgd(d).update(encode_us=math.inf), "Expected `float` <= 1e+16 - at `$.powersgd[...][...].encode_us`"),
    (lambda d: d.update(reference_op_us=-1953.4), "Expected `float` >= 0.0 - at `$.reference_op_us`"),
    (lambda d: d.update(powersgd=list(d["powersgd"].values())), "Expected `object`, got `array` - at `$.powersgd`"),
    (lambda d: d.update(version=2, encode_us_per_byte={k: {"median": v} for k, v in d["encode_us_per_byte"].items()}),
     "codec-cost layout version 2, this dagprof reads 1")])
def test_kept_codec_costs_with_a_cost_no_run_measures_are_refused(tmp_path, damage, said):
    """``optimize --allow-lossy -o OUT`` reads OUT/codec-costs.json again where it fits this machine and model: a NaN or
    negative cost in it was refused as "graph column 'dur' must be finite" (naming no file), an infinite PowerSGD cost or
    a negative reference op read silently (PowerSGD never chosen; costs not scaled to the job's load), a list or a later
    layout stopped as an internal error."""
    p = open_run(str(CTR / "defaults"))
    order = gradient_order(p.graph, p.run.ranks[0].buckets, p.run.ranks[0].meta.find_unused)
    shapes = {q: list(s) for q, s in zip(order.params, order.shapes) if s is not None}
    doc = json.loads((CTR / "codec-costs.json").read_text()) | {"machine": this_machine(), "shapes": shapes}
    damage(doc)
    kept = tmp_path / "codec-costs.json"
    kept.write_text(json.dumps(doc))
    with pytest.raises(DagprofError) as err:
        codec_costs(order, (2, 4), str(tmp_path / "out.json"), str(kept))
    line = str(err.value)
    assert line.startswith(f"{kept}: ") and said in line and line.endswith("delete it to measure them again"), line
    assert "\n" not in line


def test_codec_costs_written_with_their_layout_version_read_back():
    costs = CodecCosts.load(CTR / "codec-costs.json")  # written before the version was: read as version 1
    d = costs.to_dict()
    assert d["version"] == 1 and CodecCosts.from_dict(d) == costs


def test_a_bucket_what_if_refused_on_a_step_with_unused_parameters_names_the_flag(capsys):
    """``whatif --bucket-mb`` on the GAT (``find_unused_parameters=True``, a step that left parameters unused) was refused
    as "step 5: under find_unused_parameters=True ..." naming neither the run nor the flag."""
    rc, _, err = cli_json(capsys, "whatif", str(DATA / "ddp-fresh/gat-log-1g"), "--bucket-mb", "inf", "--no-trace")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("dagprof whatif: error: --bucket-mb inf: step 5: under "
                                                              "find_unused_parameters=True"), err


@pytest.mark.parametrize(("make", "said"), [
    (lambda p: p.symlink_to(p.name), "a symbolic link to nothing (its target is missing, or the link loops)"),
    (lambda p: None, "no such file or folder")])
def test_nccl_tests_tables_at_a_path_that_is_not_there_say_so(tmp_path, capsys, make, said):
    """``calibrate --nccl-tests`` given a link that loops or a mistyped path said "no nccl-tests tables (*GPU<N>*) here", as
    for a folder without tables."""
    path = tmp_path / "tables"
    make(path)
    rc, _, err = cli_json(capsys, "calibrate", "--nccl-tests", str(path), "-o", str(tmp_path / "link.json"))
    assert rc == 2 and err.strip() == f"dagprof calibrate: error: {path}: {said}", err


@pytest.mark.parametrize(("fixture", "other", "files", "said"), [
    ("fsdp/hsdp-tf", "fsdp/hsdp", ("rank1.json",), "rank1.json and rank0.json were recorded 115500 s apart: they are from different runs"),
    ("ddp-fresh/gat-log-1g", "ddp-fresh/dqn-loaded", ("rank1.json", "rank1.kineto.json.gz"),
     "rank1.json and rank0.json were recorded 745 s apart: they are from different runs")])
def test_a_rank_file_of_another_run_is_said_to_be_one(tmp_path, capsys, fixture, other, files, said):
    """Rank 1's file replaced by another run's of the same world size was refused for what differed first: the HSDP
    transformer's as "ranks trained different numbers of steps ... uneven inputs (DDP's Join ...)", the GAT's as another
    find_unused_parameters. Their steps never overlap rank 0's (days, minutes apart), which the traces' check said only
    after those."""
    run = copy_fixture(tmp_path, fixture)
    for name in files:
        shutil.copy(DATA / other / name, run / name)
    rc, _, err = cli_json(capsys, "analyze", str(run))
    assert rc == 2 and err.strip() == f"dagprof analyze: error: {run}: {said} (or their hosts' clocks are that far apart)", err


def test_another_run_s_kineto_trace_beside_a_rank_file_is_said_to_be_one(tmp_path, capsys):
    """The GAT's rank 1 Kineto trace replaced by the DQN's (recorded 12 minutes earlier) was refused as "mismatched
    collectives: collective #0 (all_reduce) of group 0 is missing on rank(s) [1]", naming the folder only."""
    run = copy_fixture(tmp_path, "ddp-fresh/gat-log-1g")
    shutil.copy(DATA / "ddp-fresh/dqn-loaded/rank1.kineto.json.gz", run / "rank1.kineto.json.gz")
    rc, _, err = cli_json(capsys, "analyze", str(run))
    assert rc == 2 and err.strip() == (f"dagprof analyze: error: {run}/rank1.kineto.json.gz: recorded 747 s away from rank 1's "
                                       "profiled steps: another run's Kineto trace"), err
