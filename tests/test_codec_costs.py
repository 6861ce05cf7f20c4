"""Codec costs measured on this machine: torch's own PowerSGD hook timed whole (one-process gloo group)."""
from __future__ import annotations

from dagprof.collect.measure.codec_costs import measure_codec_costs
from dagprof.costmodel.codecs import CodecCosts


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
