"""Codec costs measured on this machine: torch's own PowerSGD hook timed whole (one-process gloo group)."""
from __future__ import annotations

import json

import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.collect.measure import codec_costs as measure
from dagprof.collect.measure.codec_costs import measure_codec_costs
from dagprof.costmodel.codecs import CodecCosts, PowerSGDCost, this_machine
from dagprof.errors import DagprofError
from dagprof.passes.gradients import GradientOrder, gradient_order
from dagprof.pipeline import open_run
from dagprof.search.measured import codec_costs

CTR = DATA / "powersgd-ctr"


def test_powersgd_hook_measured_whole_per_gradient():
    # 4 MiB: the hook's passes over it (error feedback, the products) outweigh what load adds to the empty bucket it is
    # measured against (a 128 KiB gradient came out all 0 once, at load 10)
    costs = measure_codec_costs([("embed.weight", (2048, 512)), ("fc.bias", (64,))], ranks=(2,), repeats=3)
    per = costs.powersgd[2]
    assert set(per) == {"embed.weight"}  # a vector travels uncompressed: no matrix work to time
    assert costs.powersgd_bucket_us > 0 and per["embed.weight"].whole  # torch's hook timed stretch by stretch
    back = CodecCosts.from_dict(costs.to_dict())
    assert back.powersgd_bucket_us == costs.powersgd_bucket_us and back.powersgd[2]["embed.weight"] == per["embed.weight"]
    assert costs.scaled(2.0).powersgd[2]["embed.weight"].hook_decode_us == 2 * per["embed.weight"].hook_decode_us


def test_older_cost_files_load_without_the_whole_hook():
    d = CodecCosts({"fp16": 1e-3}, {"fp16": 1e-3}).to_dict()
    d.pop("powersgd_bucket_us")
    d["powersgd"] = {"2": {"w": {"encode_us": 1.0, "middle_us": 2.0, "decode_us": 3.0}}}
    c = CodecCosts.from_dict(d)
    assert c.powersgd_bucket_us == 0.0 and not c.powersgd[2]["w"].whole  # priced by the kernels alone, as before



KEPT = CodecCosts({"fp16": 1e-3, "bf16": 2e-3}, {"fp16": 3e-3}, {2: {"w": PowerSGDCost(1.0, 2.0, 3.0)}}, 4e-4, "m", 9.0, 50.0, {"w": (4, 8)})


def test_a_cost_file_reads_back_typed_as_written():
    """Written as JSON (PowerSGD's ranks as string keys, shapes as lists) and read back field by field as the same costs."""
    d = json.loads(json.dumps(KEPT.to_dict()))
    assert d["format"] == "dagprof-codec-costs" and list(d["powersgd"]) == ["2"] and d["shapes"] == {"w": [4, 8]}
    assert CodecCosts.from_dict(d) == KEPT


@pytest.mark.parametrize(("edit", "said"), [
    (lambda d: d.pop("encode_us_per_byte"), "Object missing required field `encode_us_per_byte`"),
    (lambda d: d["powersgd"].update(two={}), "Expected `int`, got `str` - at `key` in `$.powersgd`"),
    (lambda d: d["decode_us_per_byte"].update(fp16=True), "Expected `float`, got `bool` - at `$.decode_us_per_byte[...]`"),
    (lambda d: d["powersgd"]["2"]["w"].pop("middle_us"), "Object missing required field `middle_us` - at `$.powersgd[...][...]`"),
    (lambda d: d.update(copy_us_per_byte="fast"), "Expected `float`, got `str` - at `$.copy_us_per_byte`"),
    (lambda d: d.update(shapes={"w": [4, 8.5]}), "Expected `int`, got `float` - at `$.shapes[...][1]`")])
def test_a_malformed_cost_file_is_refused_in_one_line_naming_the_field(edit, said):
    d = json.loads(json.dumps(KEPT.to_dict()))
    edit(d)
    with pytest.raises(DagprofError) as err:
        CodecCosts.from_dict(d, "kept.json")
    assert str(err.value) == f"kept.json: malformed codec-cost file: {said}"

def test_hook_timed_fastest_of_runs_alternating_with_the_empty_bucket():
    # the statistic itself, on recorded stretches: a loaded machine only adds time, so each stretch is the fastest run's,
    # and the whole hook and the empty bucket alternate (whole-empty, empty-whole) so drift falls on both alike
    from dagprof.collect.measure.codec_costs import _interleaved

    calls: list[str] = []

    def runs(tag: str, stretches: list[tuple[float, float, float]]):
        it = iter(stretches)

        def run():
            calls.append(tag)
            return next(it)
        return run

    whole = runs("w", [(9.0, 9.0, 9.0)] * 2 + [(5.0, 7.0, 3.0), (4.0, 8.0, 6.0), (6.0, 2.0, 9.0), (30.0, 30.0, 30.0)])
    empty = runs("e", [(1.0, 1.0, 1.0)] * 6)
    empties: list = []
    assert _interleaved(whole, empty, 4, empties) == (4.0, 2.0, 3.0)
    assert "".join(calls) == "wewe" + "weewweew" and len(empties) == 4  # two warm-ups, then alternating pairs


def test_cost_file_measured_per_shape_once_across_ranks():
    costs = measure_codec_costs([("a", (256, 128)), ("b", (256, 128))], ranks=(1, 2), repeats=2, pairs=3)
    assert costs.powersgd[1]["a"] is costs.powersgd[1]["b"] and costs.powersgd[2]["a"] is not costs.powersgd[1]["a"]
    assert costs.powersgd_bucket_us > 0 and all(c.hook_issue_us >= 0 and c.hook_middle_us >= 0 and c.hook_decode_us >= 0
                                                for per in costs.powersgd.values() for c in per.values())



def _ctr() -> tuple[GradientOrder, dict, dict[str, list[int]]]:
    """The CTR ranker's gradients, its recorded codec-cost file (no shapes, another host's name) and its gradients' shapes."""
    p = open_run(str(CTR / "defaults"))
    order = gradient_order(p.graph, p.run.ranks[0].buckets, p.run.ranks[0].meta.find_unused)
    shapes = {q: list(s) for q, s in zip(order.params, order.shapes) if s is not None}
    return order, json.loads((CTR / "codec-costs.json").read_text()), shapes


def test_kept_costs_read_for_this_machine_and_model_else_measured_again(tmp_path, monkeypatch):
    # dagprof optimize -o OUT keeps OUT/codec-costs.json: the next run reads it where this machine measured it for these
    # gradients' shapes, measures again (saying why) where the machine or a shape differs, and refuses a damaged one
    order, d, shapes = _ctr()
    kept, out = tmp_path / "kept.json", str(tmp_path / "out.json")
    measured = CodecCosts({"fp16": 1e-3, "bf16": 1e-3}, {"fp16": 1e-3, "bf16": 1e-3}, machine="fresh")
    monkeypatch.setattr(measure, "measure_codec_costs", lambda *a, **k: measured)  # measuring takes seconds of torch

    def price(**changed):
        kept.write_text(json.dumps(d | {"machine": this_machine(), "shapes": shapes} | changed))
        return codec_costs(order, (2, 4), out, str(kept))

    found = price()
    assert found.costs is not measured and "read from" in found.note and CodecCosts.load(out) == found.costs  # the output folder holds what priced
    first = next(p for p, s in shapes.items() if len(s) == 2)
    for changed, why in (({"machine": "other x86_64"}, "'other x86_64'"), ({"shapes": shapes | {first: [3, 3]}}, f"{first} as [3, 3]"),
                         ({"shapes": {}}, "no gradient shapes")):
        found = price(**changed)
        assert found.costs is measured and "measured on this machine again" in found.note and why in found.note
    kept.write_text('{"format": "dagprof-codec')
    with pytest.raises(DagprofError, match="kept.json: .*delete it to measure them again"):
        codec_costs(order, (2, 4), out, str(kept))


def test_optimize_reads_the_codec_costs_its_output_folder_kept(tmp_path, capsys):
    # the second dagprof optimize --allow-lossy -o OUT reads OUT/codec-costs.json and says so (it staged its outputs in a new
    # folder and measured again on every run before)
    _, d, shapes = _ctr()
    out = tmp_path / "out"
    out.mkdir()
    (out / "codec-costs.json").write_text(json.dumps(d | {"machine": this_machine(), "shapes": shapes}))
    assert main(["optimize", str(CTR / "defaults"), "--allow-lossy", "--budget", "1", "-o", str(out), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(n.startswith(f"codec costs read from {out / 'codec-costs.json'}") for n in notes)
    assert CodecCosts.load(out / "codec-costs.json").shapes  # published again with this run's outputs
