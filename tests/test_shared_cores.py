"""The ``shared_cores`` interval term in the product (``search.shared_cores``): ``dagprof whatif`` puts it where the
profile records every rank on one host and the row keeps that host's own link, as ``bench/testbed/run.py`` puts it on its
unshaped cells, with the same bounds. On vendored recordings: tests/data/ddp-fresh/accum (2 gloo ranks on one 2-core
host over loopback) and a kept testbed round (tests/data/ddp-testbed-corrected: profiled at 1 Gbit/s, its unshaped
link swept alone)."""
from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.pipeline import open_run
from dagprof.search.scenario import Cluster, Scenario
from dagprof.search.shared_cores import NOTED, TERM, on_shared_cores
from dagprof.search.whatif import evaluate

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "testbed"))

LOOPBACK = DATA / "ddp-fresh" / "accum"
ROUND = DATA / "ddp-testbed-corrected" / "0" / "r2"


def _unhosted(g):
    """``g`` as a profile that recorded no hosts: whether its transfers are CPU work is then not known."""
    return g.replace(meta=g.meta.replace(host_cpus={}))


@pytest.fixture(scope="module")
def loopback():
    return open_run(str(LOOPBACK))


def test_rows_on_the_hosts_own_link_carry_the_bounds_points_unchanged(loopback):
    g = loopback.graph
    rows = [Scenario(bucket_mb=5.0), Scenario(workers=4), Scenario(bandwidth="1Gbit")]
    on = evaluate(g, rows, Cluster(), loopback.analysis.measured_us, tolerance_pct=None)
    off = evaluate(_unhosted(g), rows, Cluster(), loopback.analysis.measured_us, tolerance_pct=None)
    assert [TERM in r.interval.terms for r in on["scenarios"]] == [True, True, False]  # a wire's rate asked: not the cores' work
    assert all(TERM not in r.interval.terms for r in off["scenarios"])
    for a, b in zip(on["scenarios"], off["scenarios"]):
        assert a.predicted_iter_ms == b.predicted_iter_ms and a.interval.point_us == b.interval.point_us
        assert a.interval.lo_us <= b.interval.lo_us <= a.interval.point_us <= b.interval.hi_us <= a.interval.hi_us
    assert sum("shared-cores bounds" in n for n in on["notes"]) == 1 and not any("shared-cores bounds" in n for n in off["notes"])


def test_a_named_wire_keeps_the_term_out(loopback):
    g = loopback.graph
    assert on_shared_cores(g, Scenario(bucket_mb=5.0), Cluster())
    for s, c in ((Scenario(bucket_mb=5.0), Cluster(profiled_bandwidth="1Gbit")), (Scenario(bucket_mb=5.0), Cluster(half_duplex=True)),
                 (Scenario(latency_us=50.0), Cluster()), (Scenario(bucket_mb=5.0), Cluster(topology="nvlink/100gbe:2"))):
        assert not on_shared_cores(g, s, c)
    assert not on_shared_cores(_unhosted(g), Scenario(bucket_mb=5.0), Cluster())


def test_whatif_json_and_text_say_it(capsys):
    assert main(["whatif", str(LOOPBACK), "--bucket-mb", "5", "--allow-model-error", "--no-trace", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["scenarios"][0]
    assert TERM in row["interval_basis"]["terms"] and row["lo_ms"] < row["predicted_median_ms"] < row["hi_ms"]
    assert main(["whatif", str(LOOPBACK), "--bucket-mb", "5", "--allow-model-error", "--no-trace"]) == 0
    assert "include the shared-cores bounds:" in capsys.readouterr().out


def test_whatif_puts_the_bounds_the_testbed_cell_puts():
    """The kept round's unshaped cells (2 ranks; 1, 5, 25 MiB buckets) and whatif on its profile with the round's own
    sweep of that link as --link-model: the term moves each end by the same time (the points differ: the bench's is the
    averaged iteration's, whatif's interval stands around the replayed steps' median)."""
    import run

    import dagprof.search.shared_cores as sc
    from dagprof.collect.measure.calibrate import fit

    with open(ROUND / "results.json") as f:
        sweep = json.load(f)[1]
    link = fit([tuple(x) for x in sweep], 2)
    caps = (1.0, 5.0, 25.0)
    cells = [(2, "unlimited", c) for c in caps]
    args = (str(ROUND / "run"), (2, "1Gbit", 1.0), sweep, "unlimited", cells, 2)
    _, bench, _ = run.predict(*args, raw=True)
    keep, sc.with_shared_cores = sc.with_shared_cores, lambda iv, *a, **k: iv
    try:
        _, bare, _ = run.predict(*args, raw=True)
    finally:
        sc.with_shared_cores = keep
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "unshaped.json")
        with open(path, "w") as f:
            json.dump({"alpha_us": link.alpha_us, "beta_us_per_byte": link.beta_us_per_byte, "gamma_us_per_byte": 0.0,
                       "backend": "gloo", "workers": 2, "points": sweep, "method": "allreduce", "version": 3}, f)
        g = open_run(str(ROUND / "run")).graph
        rows = [Scenario(bucket_mb=c) for c in caps]
        on = evaluate(g, rows, Cluster(link_model=path), tolerance_pct=None, raw=True)["scenarios"]
        off = evaluate(_unhosted(g), rows, Cluster(link_model=path), tolerance_pct=None, raw=True)["scenarios"]
    for c, a, b in zip(cells, on, off):
        assert a.interval.hi_us - b.interval.hi_us == pytest.approx(bench[c].hi_us - bare[c].hi_us, rel=1e-6)
        assert b.interval.lo_us - a.interval.lo_us == pytest.approx(bare[c].lo_us - bench[c].lo_us, rel=1e-6)
        assert bench[c].hi_us > bare[c].hi_us and bench[c].lo_us < bare[c].lo_us


def _search(g, run):
    from dagprof.search.optimize import Options, search_run

    return search_run(run, g, Options(budget_s=60.0, max_candidates=40, patience=20))


def test_optimize_prices_the_bounds_for_both_ends_search_unchanged(loopback):
    """``search``'s strategy intervals take the term where ``whatif`` would (every rank on one host, the link kept): the
    baseline's and the best candidate's bounds; the same profile without recorded hosts gets none, and the search finds
    the same candidates at the same points either way."""
    on, off = _search(loopback.graph, loopback.run), _search(_unhosted(loopback.graph), loopback.run)
    assert set(on.shared_cores) == {"baseline", "best"} and off.shared_cores == {}
    assert all(above > 0 and below >= 0 for above, below in on.shared_cores.values())
    assert on.best.candidate == off.best.candidate and on.best.iter_us == off.best.iter_us and on.baseline.iter_us == off.baseline.iter_us
    assert on.intervals == off.intervals  # the search's own intervals: the bounds are added after the level (find_strategy)
    assert sum("include the shared-cores bounds:" in n for n in on.notes) == 1
    assert not any("shared-cores bounds" in n for n in off.notes)


def test_find_strategy_adds_the_bounds_after_the_level_and_verify_says_it(monkeypatch):
    """``find_strategy``'s intervals are the level-widened ones with the bounds added at both ends (points kept), and
    ``--verify``'s report, which holds the measured strategy against the best's interval, says the bounds are in it."""
    import dagprof.closeloop as cl
    from dagprof.cli.cmd_optimize import verification_lines
    from dagprof.collect.jobs.verify import Verification
    from dagprof.search.optimize import Options

    opts = Options(budget_s=60.0, max_candidates=40, patience=20)
    with tempfile.TemporaryDirectory() as tmp:
        found = cl.find_strategy(str(LOOPBACK), opts, tmp)
        monkeypatch.setattr(cl, "add_bounds", lambda iv, bounds: iv)
        bare = cl.find_strategy(str(LOOPBACK), opts, tmp)
    res = found.search
    for name, iv in res.intervals.items():
        above, below = res.shared_cores[name]
        plain = bare.search.intervals[name]
        assert TERM in iv.terms and TERM not in plain.terms and iv.point_us == plain.point_us
        assert iv.hi_us == pytest.approx(plain.hi_us + above, rel=1e-9)
        assert iv.lo_us == pytest.approx(max(plain.lo_us - below, 0.0), rel=1e-9)
    v = cl.Checked(Verification([50.0, 52.0, 51.0], [49.0, 50.0, 48.0]), res.speedup, [res.speedup] * 3,
                   interval=res.intervals["best"]).to_dict()
    assert TERM in v["predicted_strategy"]["interval_basis"]["terms"]
    assert any("with the shared-cores bounds" in ln for ln in verification_lines(v))


def test_optimize_json_and_text_say_it(capsys):
    from dagprof.cli.cmd_optimize import to_text

    with tempfile.TemporaryDirectory() as tmp:
        assert main(["optimize", str(LOOPBACK), "--json", "-o", tmp]) == 0
    r = json.loads(capsys.readouterr().out)
    for end in ("baseline", "best"):
        assert TERM in r[end]["interval_basis"]["terms"] and r[end]["lo_ms"] < r[end]["predicted_iter_ms"] < r[end]["hi_ms"]
    assert "include the shared-cores bounds:" in to_text(r)


def test_the_demos_optimisation_text_says_it():
    """The demo's own case, a 2-rank gloo DDP demo job on one host (tests/data/profiler-spike/hog-window, searched raw as
    the demo searches): its optimisation lines print both intervals and the note that says what widened them."""
    from dagprof.cli.cmd_demo import to_text
    from dagprof.closeloop import find_strategy
    from dagprof.demo import _summary
    from dagprof.search.optimize import Options

    run = str(DATA / "profiler-spike" / "hog-window")
    with tempfile.TemporaryDirectory() as tmp:
        found = find_strategy(run, Options(budget_s=60.0, max_candidates=40, patience=20), tmp, raw=True)
        r = _summary(open_run(run), found, None, {}, run) | {"whatifs": [], "scaling_outlook": {}, "cluster": "loopback", "notes": []}
    lines = to_text(r).splitlines()
    best = "the strategy" if r["optimisation"]["strategy_file"] else "the best candidate (not written)"  # no file: no strategy named
    assert any(ln.startswith("  predicted ") and f"per step with {best}; profiled setup" in ln for ln in lines)
    assert sum(ln.startswith("  note: ") and NOTED in ln for ln in lines) == 1
    assert not any("(shared_cores)" in ln or "vm's" in ln for ln in lines)  # no internal term, no "host vm's"


def test_optimize_takes_no_bounds_on_a_named_wire(capsys):
    """The kept testbed round's profile (ROUND: 2 ranks in namespaces of one 2-core host, their veth shaped by tc at 1 Gbit/s)
    records one host, so the bounds go on; ``--profiled-bandwidth 1Gbit``, whatif's flag, names the wire: no bounds, and
    the fit read against the wire in a note, as whatif says it. The same flag's parsing refuses a bad rate in one line."""
    out = {}
    for flags in ((), ("--profiled-bandwidth", "1Gbit")):
        with tempfile.TemporaryDirectory() as tmp:
            assert main(["optimize", str(ROUND / "run"), "--json", "-o", tmp, *flags]) == 0
        out[bool(flags)] = json.loads(capsys.readouterr().out)
    bare, named = out[False], out[True]
    for end in ("baseline", "best"):
        assert TERM in bare[end]["interval_basis"]["terms"] and TERM not in named[end]["interval_basis"]["terms"]
    assert named["baseline"]["hi_ms"] < bare["baseline"]["hi_ms"]  # the bounds reached 7 % above it on this profile
    assert sum("shared-cores bounds" in n for n in bare["notes"]) == 1 and not any("shared-cores bounds" in n for n in named["notes"])
    assert sum(n.startswith("--profiled-bandwidth 1Gbit: the link fitted to") for n in named["notes"]) == 1
    assert not any("--profiled-bandwidth" in n for n in bare["notes"])
    assert main(["optimize", str(ROUND / "run"), "--profiled-bandwidth", "fast"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot read bandwidth" in err and "Traceback" not in err and len(err.splitlines()) <= 2


def test_the_python_api_and_verify_carry_the_named_wire():
    """``Options.profiled_bandwidth`` reaches ``find_strategy``'s intervals (no bounds) and its ``Found``, from which
    ``--verify`` prices each round's profile (``predict_run``) on the same wire and says no bounds in its line."""
    import dagprof.closeloop as cl
    from dagprof.cli.cmd_optimize import verification_lines
    from dagprof.collect.jobs.verify import Verification
    from dagprof.search.optimize import Options, predict_run

    with tempfile.TemporaryDirectory() as tmp:
        found = cl.find_strategy(str(ROUND / "run"), Options(budget_s=60.0, max_candidates=40, patience=20, profiled_bandwidth="1Gbit"), tmp)
    res = found.search
    assert found.profiled_bandwidth == "1Gbit" and res.shared_cores == {}
    assert all(TERM not in iv.terms for iv in res.intervals.values())
    v = cl.Checked(Verification([50.0, 52.0, 51.0], [49.0, 50.0, 48.0]), res.speedup, [res.speedup] * 3,
                   interval=res.intervals["best"]).to_dict()
    assert not any("shared-cores bounds" in ln for ln in verification_lines(v))
    p = found.profile
    priced = predict_run(p.run, p.graph, found.strategy, profiled_bandwidth="1Gbit")
    assert priced.graph.meta.wire_bytes_per_s == pytest.approx(1e9 / 8)
    if not res.worth_applying:  # the strategy is the profiled layout: the same price on both sides
        assert priced.prediction.speedup == pytest.approx(1.0)
