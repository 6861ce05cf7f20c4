"""``bench_sgd.py --testbed`` end to end on a tiny job: a one-rank profile, sweeps written as ``dagprof calibrate``
link models, DDP cells under both policies, and ``dagprof sgd`` predicting every cell from the run folder.
(bench/bench_sgd.py --testbed runs the real grid.)"""
import argparse
import json
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from testdata import DATA  # noqa: E402

from dagprof.collect.jobs import netns  # noqa: E402

why = netns.available()


def test_a_round_dagprof_sgd_cannot_anchor_is_named_not_fatal():
    """A round whose unprofiled one-rank step is shorter than the profile's compute (beyond the profiler's cost) has no
    ``unprofiled`` rows: ``dagprof sgd`` refuses that anchor by design, so the bench skips the round with the reason."""
    import sgd_testbed as tb

    from dagprof.traces.layerwise import read_layer_file

    run = str(DATA / "ddp-testbed" / "run")
    p = read_layer_file(run)
    compute_ms = float(p.forward_or_zero().sum() + p.backward_us.sum() + p.update_us) / 1e3
    assert tb.refused_anchor({"run": run, "iter_1_unprofiled_ms": compute_ms}) is None
    why = tb.refused_anchor({"run": run, "iter_1_unprofiled_ms": 0.5 * compute_ms})
    assert why.startswith("single-worker iteration") and "shorter than the profile's own compute" in why


@pytest.mark.skipif(why is not None, reason=f"testbed: {why}")
def test_one_tiny_round(tmp_path, monkeypatch):
    import sgd_testbed as tb

    monkeypatch.setattr(tb, "JOB", argparse.Namespace(width=64, depth=3, batch=8, warmup=1, steps=2, profile_steps=3, profile_margin=1))
    monkeypatch.setattr(tb, "RANKS", (2,))
    rnd = tb.run_round(str(tmp_path / "0"), random.Random(0), repredict=False)
    cells = {(2, rate, p) for rate in tb.RATES for p in tb.POLICIES}
    assert set(rnd["measured"]) == cells and min(rnd["measured"].values()) > 0
    # per link, one file of the sweep with the overlap beside calibrate --overlap's matrix loop, one beside the job's own backward
    assert set(rnd["links"]) == {(s, 2, rate) for s in ("calibrate", "calibrate-bwd") for rate in tb.RATES}
    for (source, _, _), path in rnd["links"].items():
        with open(path) as f:
            doc = json.load(f)
            # with the overlap measured on the same ranks and link, beside an all-reduce of the job's per-layer size
            assert doc["workers"] == 2 and doc["overlap"]["allreduce_bytes"] == int(tb.OVERLAP_MB * 2**20) and doc["overlap"]["comm_slowdown"] >= 0
            assert doc["overlap"]["beside"] == {"calibrate": "matmul", "calibrate-bwd": "backward"}[source]
    pred = tb.predict_round(rnd, cores=2, tmp=str(tmp_path))
    assert {k[3:] for k in pred} == cells and min(pred.values()) > 0
    # so tiny a job's unprofiled steps may run faster than its profiled ops less the profiler's cost: that anchor refused
    why = tb.refused_anchor(rnd)
    assert {k[2] for k in pred} == ({"profiled"} if why else {"profiled", "unprofiled"})
    assert why is None or why.startswith("single-worker iteration")
    assert {k[1] for k in pred} == set(tb.COMPUTE)  # contention priced by default, and without it (--no-contention)
    assert {k[0] for k in pred} == {"net", "calibrate", "calibrate-bwd"}
    # one rank's profile: the anchor is its own iteration (profiled) or the unprofiled steps around it
    assert rnd["iter_1_profiled_ms"] > 0 and rnd["iter_1_unprofiled_ms"] > 0
    # where the step goes: the same compute under both policies; one fused message costs no more than one per layer
    parts = tb.parts_round(rnd, cores=2)
    assert set(parts) == cells and min(min(v) for v in parts.values()) > 0
    for rate in tb.RATES:
        assert parts[2, rate, "wfbp"][0] == parts[2, rate, "fused"][0] and parts[2, rate, "fused"][1] <= parts[2, rate, "wfbp"][1] * (1 + 1e-9)
    assert all(rnd["measured_fastest"][c] <= rnd["measured"][c] for c in cells)
    # the model's layers are DDP's buckets: every Linear (one parameter, no bias) is a layer with gradient bytes
    from dagprof.traces.layerwise import read_layer_file

    profile = read_layer_file(rnd["run"])
    assert (profile.grad_bytes > 0).sum() == tb.JOB.depth
    again = tb.run_round(str(tmp_path / "0"), random.Random(0), repredict=True)  # a kept round, read back
    assert again["measured"] == rnd["measured"]
