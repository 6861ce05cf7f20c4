"""dagprof.apply on real 2-rank gloo DDP (loopback): bucket layouts, codec hooks, recomputation,
accumulation, and the one-line refusal of a strategy for another model. Plus the strategy file."""
import json
import os

import pytest
from testdata import DATA, worker_results

from dagprof.collect.deploy.strategy import Bucket, Compression, Prediction, Strategy, load_strategy, save_strategy
from dagprof.errors import DagprofError

WORKER = os.path.join(os.path.dirname(__file__), "apply_worker.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("apply")
    return worker_results(WORKER, out)


def test_custom_bucket_boundaries_are_what_ddp_rebuilds(results):
    for r in results:
        assert r["layout_differences"] is None
        assert [int(x) for x in r["rebuilt"].split(",")] == r["want"]
        assert r["buckets_err"] < 1e-5  # same training, other buckets


def test_find_unused_buckets_are_built_as_the_strategy_says(results):
    for r in results:
        assert r["unused_built"] == r["unused_want"] and r["unused_err"] < 1e-5
        assert "never rebuilds its buckets" in r["unused_refused"] and "bucket 0" in r["unused_refused"] and "\n" not in r["unused_refused"]


def test_codec_and_partition_hooks_average_like_ddp(results):
    for r in results:
        assert r["parts3"] < 1e-5 and r["bucket_view"] < 1e-5 and r["recompute"] < 1e-5
        assert r["fp16"] < 5e-3 and r["fp16_parts2"] < 5e-3  # fp16 rounding
        assert r["bf16"] < 5e-2
        assert r["powersgd_finite"]


def test_accumulation_plan(results):
    for r in results:
        assert r["micro_batches"] == 2 and r["sync0_is_no_sync"] and r["again_same_plan"]


def test_mismatched_strategy_is_refused_in_one_line(results):
    for r in results:
        assert "strategy does not match the model" in r["mismatch_name"] and "no.such.weight" in r["mismatch_name"]
        assert "elements in the strategy" in r["mismatch_size"]
        assert "\n" not in r["mismatch_name"] + r["mismatch_size"]


def strategy(**kw) -> Strategy:
    base = dict(model=(("a.weight", 6), ("a.bias", 2)), world_size=2,
                buckets=(Bucket(("a.bias",), 8, ("a",)), Bucket(("a.weight",), 24, ("a",))),
                compression=Compression("fp16"), prediction=Prediction(630.0, 470.0, 12))
    return Strategy(**{**base, **kw})


def test_strategy_file_round_trips(tmp_path):
    s = strategy(recompute=("blocks.1",), accumulate=2)
    p = save_strategy(s, tmp_path / "s.json")
    assert load_strategy(p) == s
    d = json.load(open(p))
    assert d["format"] == "dagprof-strategy" and d["version"] == 1 and len(d["caveats"]) == 2
    assert d["summary"] == s.summary()


def test_summary_reads_plainly():
    text = strategy().summary()
    assert text.startswith("2 buckets ending at a and a, fp16 hook: predicted 630 -> 470 ms (-25 %")
    one = strategy(buckets=(Bucket(("a.weight", "a.bias"), 32, ("a",)),), partition=2, accumulate=2).summary()
    assert one.startswith("1 bucket ending at a, fp16 hook, each bucket in 2 pieces, 2 micro-batches per step"), one
    assert strategy(buckets=None, compression=Compression()).summary().startswith("keep DDP's defaults")
    three = strategy(buckets=tuple(Bucket((f"{n}.weight",), 8, (n,)) for n in ("layers.7.conv2", "layers.3.conv1", "stem.0")))
    assert three.summary().startswith("3 buckets ending at layers.7.conv2, layers.3.conv1 and stem.0, fp16 hook")  # no a|b|c


_V1 = {"format": "dagprof-strategy", "version": 1}


@pytest.mark.parametrize("text,msg", [
    (json.dumps({"format": "x"}), "not a dagprof strategy file \\(format 'x'"),
    (json.dumps({"format": "dagprof-run", "version": 1, "world_size": 2}), "not a dagprof strategy file \\(format 'dagprof-run'"),
    (json.dumps({**_V1, "version": 99}), "newer dagprof \\(format version 99; this one reads 1..2\\): upgrade dagprof"),
    (json.dumps({"format": "dagprof-strategy"}), "older dagprof \\(format version 0; .*optimize again"),
    (json.dumps(_V1), "corrupt dagprof strategy file \\(Object missing required field `model`"),
    (json.dumps({**_V1, "model": [], "world_size": 2, "compression": {"codec": "zip"}}), "Invalid enum value 'zip' - at `\\$.compression.codec`"),
    (json.dumps({**_V1, "model": [["a", "six"]], "world_size": 2}), "Expected `int`, got `str` - at `\\$.model\\[0\\]\\[1\\]`"),
    (json.dumps([_V1]), "corrupt file \\(Expected `object`, got `array`"),
    (json.dumps({**_V1, "model": []})[:-9], "truncated"),
    ("", "truncated"),
])
def test_bad_strategy_files_are_one_line_errors(tmp_path, text, msg):
    p = tmp_path / "s.json"
    p.write_text(text)
    with pytest.raises(DagprofError, match=msg) as e:
        load_strategy(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_missing_strategy_file(tmp_path):
    with pytest.raises(DagprofError, match="file is missing") as e:
        load_strategy(tmp_path / "missing.json")
    assert "missing.json" in str(e.value)


def test_a_version_1_file_reads(tmp_path):
    """``tests/data/strategy/v1.json`` was written by the first (dataclass) implementation; every later reader must read it."""
    s = load_strategy(DATA / "strategy" / "v1.json")
    assert s.compression == Compression("powersgd", 2) and s.accumulate == 2 and s.recompute == ("blocks.1",)
    assert s.buckets[1] == Bucket(("a.weight",), 24, ("a",)) and s.model == (("a.weight", 6), ("a.bias", 2))
    assert s.prediction == Prediction(630.0, 470.0, 12) and s.notes == ("written by dagprof 0.1",)
    assert load_strategy(save_strategy(s, tmp_path / "again.json")) == s
    again, v1 = (json.loads((d / n).read_text()) for d, n in ((tmp_path, "again.json"), (DATA / "strategy", "v1.json")))
    # every field as v1 wrote it; only the line for people reads as a sentence now (not v1's "layers a|a")
    assert {k: v for k, v in again.items() if k != "summary"} == {k: v for k, v in v1.items() if k != "summary"}
    assert again["summary"].startswith("2 buckets ending at a and a, PowerSGD") and "|" in v1["summary"]
