"""Clock offsets from collective ends: a +37 ms skew is undone to within 1 ms; residual skew is reported."""
from __future__ import annotations

import glob
import json
import os

import pytest
from testdata import KINETO_PUBLIC as DATA

from dagprof.align.clocks import align_clocks, estimate_offsets
from dagprof.errors import DagprofError
from dagprof.report.merged_trace import write_merged_trace
from dagprof.traces.events import Run
from dagprof.traces.kineto_dir import read_trace_dir

from gloo_kineto import gloo_traces

SKEW_NS = 37_000_000


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """Our 2-rank gloo traces with rank 1 on another host whose clock runs 37 ms ahead."""
    out = tmp_path_factory.mktemp("skewed")
    for f in glob.glob(f"{gloo_traces()}/*.json"):
        doc = json.load(open(f))
        if os.path.basename(f).startswith("rank-1"):
            doc["baseTimeNanoseconds"] += SKEW_NS
            doc["host_name"] = "another-host"  # one host has one clock: a skew needs two
        (out / os.path.basename(f)).write_text(json.dumps(doc))
    return read_trace_dir(out)


def test_skewed_rank_is_realigned_within_1ms(skewed):
    same = estimate_offsets(read_trace_dir(gloo_traces()))  # same host: offset ~0
    a = estimate_offsets(skewed)
    assert a.offset_us[0] == 0.0
    assert abs(a.offset_us[1] - (same.offset_us[1] - SKEW_NS / 1000)) < 1.0  # the shift is recovered exactly
    assert abs(a.offset_us[1] + SKEW_NS / 1000) < 1000.0  # and the clocks agree within 1 ms
    # the residual is the recording's own (ranks leaving a collective apart: over 1 ms where the traces were recorded on a
    # loaded host), not the skew's
    assert abs(a.residual_us["median"] - same.residual_us["median"]) < 1.0 and a.instances_used >= 4
    aligned, _ = align_clocks(skewed)
    r0, r1 = aligned.ranks
    assert abs((r1.base_ns - r0.base_ns) - (skewed.ranks[1].base_ns - skewed.ranks[0].base_ns - SKEW_NS)) < 1_000_000


def test_merged_trace_has_every_rank_on_one_clock(skewed, tmp_path):
    path, a = write_merged_trace(tmp_path / "merged.json", skewed)
    doc = json.load(open(path))
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == sum(len(t.events) for t in skewed.ranks)
    assert {e["pid"] for e in xs} == {0, 1}
    assert doc["metadata"]["clock_offset_us"]["1"] == pytest.approx(a.offset_us[1])
    # aligned: the ranks' first step markers are as far apart as in the recording on its true clock
    # (same host), within 1 ms; they were 37 ms further apart. Ranks do not start a step together.
    true_path, _ = write_merged_trace(tmp_path / "true.json", read_trace_dir(gloo_traces()))
    assert abs(first_step_skew(path) - first_step_skew(true_path)) < 1000.0


def first_step_skew(path) -> float:
    """Rank 1's first ProfilerStep start minus rank 0's in a merged trace, us."""
    steps = {}
    for e in json.load(open(path))["traceEvents"]:
        if e["ph"] == "X" and e["name"].startswith("ProfilerStep#"):
            steps.setdefault(e["pid"], []).append(e["ts"])
    return min(steps[1]) - min(steps[0])


def test_sampled_job_ranks_are_aligned_with_residual_reported():
    a = estimate_offsets(read_trace_dir(f"{DATA}/trace_filter"))
    assert a.instances_used >= 3
    assert abs(a.offset_us[1]) < 5000.0  # same job, NTP-synced hosts: a few ms at most
    assert 0.0 < a.residual_us["median"] < 5000.0
    assert "residual skew" in a.summary()


def test_ranks_without_shared_collectives_cannot_be_aligned():
    run = read_trace_dir(gloo_traces())
    lonely = Run([run.ranks[0]], source="x")
    assert estimate_offsets(lonely).offset_us == {0: 0.0}
    import numpy as np

    from dagprof.align.matching import Matching
    empty = Matching([np.full(len(t.events), -1) for t in run.ranks], [])
    with pytest.raises(DagprofError, match="share no matched collective"):
        estimate_offsets(run, empty)
