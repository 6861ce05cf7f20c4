"""whatif prices compute slowed beside in-flight collectives (``passes.overlap``) where the run or the link-model file
measured it: taken out of the profiled op times, charged again under each scenario, each collective by its bytes per
second against the measured all-reduce's. On a real DDP testbed round (tests/data/ddp-testbed: 2 gloo ranks in network
namespaces, profiled at 1 Gbit/s with 1 MiB buckets) and a real ``dagprof calibrate --overlap`` of the testbed's unshaped
veth link (slowdown 0.59 per unit of overlap beside an 8 MiB all-reduce at 0.99 GB/s)."""
from __future__ import annotations

import json
import os
import sys

import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.pipeline import open_run
from dagprof.search.measured import slowdown_of
from dagprof.search.scenario import Cluster, sweep
from dagprof.search.whatif import evaluate

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "testbed"))

ROUND = DATA / "ddp-testbed"
RUN, OVERLAP, OVERLAP_1GBIT = ROUND / "run", ROUND / "unshaped-overlap.json", ROUND / "1gbit-overlap.json"
UNSHAPED4 = ROUND / "unshaped4-overlap.json"  # 4 ranks on the unshaped link: its all-reduce fit and slowdown


@pytest.fixture(scope="module")
def prof():
    return open_run(str(RUN))


def test_a_faster_link_slows_the_overlapping_backward_more(prof):
    s, rate = slowdown_of(prof.run, str(OVERLAP))  # the file's 0.591 per unit of the disturbed loop (written before
    assert s == pytest.approx(0.591 / (1 - 0.591), abs=1e-3) and rate == pytest.approx(0.986e9, rel=1e-3)  # per_undisturbed)
    scenarios = sweep({"bandwidth": ["200Mbit", "1Gbit", "8Gbit"], "bucket_mb": [1.0]})
    plain = evaluate(prof.graph, scenarios, Cluster(), prof.analysis.measured_us)
    slowed = evaluate(prof.graph, scenarios, Cluster(slowdown=s, comm_rate=rate), prof.analysis.measured_us)
    # the profiled run: what is taken out of its op times is charged back on the same timeline
    assert slowed["model_iter_ms"] == pytest.approx(plain["model_iter_ms"], rel=5e-3)
    assert slowed["overlap_slowdown"] == s and plain["overlap_slowdown"] == 0.0
    assert any("taken out of the profiled op times" in n for n in slowed["notes"]) and not any("overlap" in n for n in plain["notes"])
    change = [b.predicted_iter_ms / a.predicted_iter_ms - 1 for a, b in zip(plain["scenarios"], slowed["scenarios"])]
    # wire-bound links (a small share of the measured all-reduce's bytes per second): unchanged; 8 Gbit/s (the unshaped link's
    # rate): the backward beside its all-reduces slows, and the step with it
    assert abs(change[0]) < 0.01 and abs(change[1]) < 0.01 and change[2] > 0.05
    for b in slowed["scenarios"]:
        assert b.interval.lo_us <= b.interval.point_us <= b.interval.hi_us


def test_whatif_cli_takes_the_slowdown_from_the_link_model(capsys):
    assert main(["whatif", str(RUN), "--bandwidth", "8Gbit", "--bucket-mb", "1", "--link-model", str(OVERLAP),
                 "--allow-model-error", "--no-trace", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["overlap_slowdown"] == pytest.approx(0.591 / (1 - 0.591), abs=1e-3) and r["overlap_rate_bytes_per_s"] > 0
    assert main(["whatif", str(RUN), "--bandwidth", "8Gbit", "--no-trace", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overlap_slowdown"] == 0.0  # the run measured none, no file: as before


def test_testbed_cells_price_it_as_whatif_does():
    """bench/testbed/run.py's cells: the shaped ones (wire-bound all-reduces) do not move; the unshaped link's 1 MiB
    buckets, whose all-reduces overlap backward at the copies' full rate, come out slower."""
    import run

    with open(ROUND / "results.json") as f:
        sweep_points = json.load(f)[1]
    cells = [(2, "1Gbit", 5.0), (2, "200Mbit", 1.0), (2, "unlimited", 1.0)]
    args = (str(RUN), (2, "1Gbit", 1.0), sweep_points, "unlimited", cells, 2)
    plain, _, _ = run.predict(*args, raw=True)
    slowed, intervals, _ = run.predict(*args, raw=True, calibrated={(2, "unlimited"): str(OVERLAP)})
    assert abs(slowed[cells[0]] / plain[cells[0]] - 1) < 0.01 and abs(slowed[cells[1]] / plain[cells[1]] - 1) < 0.01
    assert slowed[cells[2]] > plain[cells[2]]
    assert all(intervals[c].lo_us / 1e3 <= slowed[c] <= intervals[c].hi_us / 1e3 for c in cells)


def test_testbed_takes_the_profiled_links_own_slowdown_out():
    """With the profiled link's own measurement (1 Gbit/s: 0.22 beside its all-reduce, where the unshaped link's bytes per
    second would price the profile's overlap at an eighth of 0.59), the profiled cell stays put and the unshaped link's cell
    whose one bucket overlaps no compute comes out faster: the profile's backward was slowed by its own all-reduces."""
    import run

    with open(ROUND / "results.json") as f:
        sweep_points = json.load(f)[1]
    cells = [(2, "1Gbit", 1.0), (2, "unlimited", 25.0)]
    args = (str(RUN), (2, "1Gbit", 1.0), sweep_points, "unlimited", cells, 2)
    alone, _, _ = run.predict(*args, raw=True, calibrated={(2, "unlimited"): str(OVERLAP)})
    both, _, _ = run.predict(*args, raw=True, calibrated={(2, "unlimited"): str(OVERLAP), (2, "1Gbit"): str(OVERLAP_1GBIT)})
    assert both[cells[0]] == pytest.approx(alone[cells[0]], rel=5e-3)
    assert both[cells[1]] < alone[cells[1]] * 0.99


def test_testbed_prices_4_ranks_on_the_swept_link_by_their_own_sweep():
    """A calibrate file of the swept link at 4 ranks replaces ``beta * ranks / cores`` (2x the 2-rank sweep's time per
    byte) by what 4 ranks measured (1.3x here, quiet machine): the 4-rank unshaped cell comes out faster; shaped 4-rank
    cells keep their link."""
    import run

    from dagprof.collect.measure.calibrate import fit
    from dagprof.costmodel.topology import read_link_model

    with open(ROUND / "results.json") as f:
        sweep_points = json.load(f)[1]
    cells = [(4, "unlimited", 25.0), (4, "1Gbit", 25.0)]
    args = (str(RUN), (2, "1Gbit", 1.0), sweep_points, "unlimited", cells, 2)
    rule, _, _ = run.predict(*args, raw=True)
    measured, _, _ = run.predict(*args, raw=True, calibrated={(4, "unlimited"): str(UNSHAPED4)})
    assert read_link_model(UNSHAPED4).link_for(4).beta_us_per_byte < 2 * fit([tuple(p) for p in sweep_points], 2).beta_us_per_byte
    assert measured[cells[0]] < rule[cells[0]] * 0.95
    assert measured[cells[1]] == pytest.approx(rule[cells[1]], rel=1e-9)  # its slowdown: none measured for 4 ranks at 1 Gbit/s


def test_profile_cells_says_where_a_profiled_cells_step_goes():
    """``bench/testbed/profile_cells.py``'s summary of a profile: per rank, each kind's median time a step, and the
    collectives'; on the kept round's 1 Gbit/s 1 MiB profile the backward is the largest part of the compute."""
    import profile_cells

    lines = profile_cells.parts(str(RUN))
    assert [line.split(":")[0] for line in lines[:2]] == ["rank 0", "rank 1"] and lines[2].startswith("collectives ")
    for line in lines[:2]:
        ms = {k: float(v) for k, v in (p.split() for p in line.split(": ", 1)[1].split(", "))}
        assert set(ms) == {"forward", "backward", "update", "other", "comm_enqueue"}
        assert ms["backward"] == max(ms.values()) > 0


def test_testbed_unshaped_cells_reach_the_shared_cores_bounds():
    """The unshaped link is the ranks' own CPU work priced by a sweep timed alone, and no slowdown was measured for the
    profiled link: each unshaped cell's interval reaches up to its all-reduces and compute sharing the 2 cores (each at
    half speed where they overlap) and down to the profile's backward run without the slowdown its own buckets may have
    put on it. 1 MiB buckets overlap the backward (the high end moves far), one 25 MiB bucket follows it (the low end
    does); the shaped cells keep their interval, and every point stays."""
    import run

    with open(ROUND / "results.json") as f:
        sweep_points = json.load(f)[1]
    cells = [(2, "200Mbit", 1.0), (2, "unlimited", 1.0), (2, "unlimited", 25.0)]
    args = (str(RUN), (2, "1Gbit", 1.0), sweep_points, "unlimited", cells, 2)
    points, intervals, _ = run.predict(*args, raw=True)
    shaped, small, one = (intervals[c] for c in cells)
    assert "shared_cores" not in shaped.terms and "shared_cores" in small.terms and "shared_cores" in one.terms
    assert all(iv.point_us == pytest.approx(1e3 * points[c]) and iv.lo_us < iv.point_us < iv.hi_us for c, iv in intervals.items())
    above, below = ({c: f(iv) for c, iv in ((cells[1], small), (cells[2], one))} for f in (lambda iv: iv.hi_us / iv.point_us - 1,
                                                                                          lambda iv: 1 - iv.lo_us / iv.point_us))
    assert above[cells[1]] > 2 * above[cells[2]] and below[cells[2]] > below[cells[1]]
    # the profiled link's own slowdown measured (calibrate --overlap at 1 Gbit/s): the point takes it out, so no low-end bound
    _, measured, _ = run.predict(*args, raw=True, calibrated={(2, "1Gbit"): str(OVERLAP_1GBIT)})
    assert measured[cells[2]].lo_us > one.lo_us and "shared_cores" in measured[cells[1]].terms


def test_slowed_comm_lengthens_only_collectives_beside_compute(prof):
    """``passes.overlap.slowed_comm``: a collective's duration times 1 + s f, f its share of the replay beside compute."""
    from dagprof.passes.overlap import slowed_comm
    from dagprof.replay import replay
    from dagprof.traces.events import Kind

    g = prof.graph
    res = replay(g)
    comm = (g.kind == Kind.COMM) & (g.rank < 0) & (g.dur > 0)
    assert (slowed_comm(g, res, 0.0) == g.dur).all()
    ratio = slowed_comm(g, res, 1.0)[comm] / g.dur[comm]
    assert (ratio >= 1.0).all() and (ratio <= 2.0 + 1e-9).all() and ratio.max() > 1.1
    assert (slowed_comm(g, res, 1.0)[~comm] == g.dur[~comm]).all()
