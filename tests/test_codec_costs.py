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
