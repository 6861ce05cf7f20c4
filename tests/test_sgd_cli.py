"""``dagprof sgd`` end to end: text, --json rows, the SVG chart, one-line errors with line numbers."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from testdata import DATA as TESTDATA

from dagprof.cli.main import main
from dagprof.report.svg import speedup_chart

DATA = TESTDATA / "bcaffe-k80-googlenet"

CSV = """# io_us=1000, h2d_us=200, update_us=500
layer,forward_us,backward_us,grad_bytes
conv1,2000,4000,40000
conv2,3000,6000,4000000
fc,500,1000,16000000
"""


def run_json(capsys, *argv) -> dict:
    assert main(["sgd", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_csv_scaling_json(tmp_path, capsys):
    f = tmp_path / "net.csv"
    f.write_text(CSV)
    r = run_json(capsys, str(f), "--workers", "1,2,4,8", "--net", "10gbe", "--replay")
    assert [row["workers"] for row in r["rows"]] == [1, 2, 4, 8]
    one = r["rows"][0]
    assert one["iter_time_s"] == pytest.approx(0.017) and one["speedup"] == pytest.approx(1.0)  # 5.5 + 11 + 0.5 ms, I/O prefetched
    for row in r["rows"]:
        assert set(row) >= {"workers", "iter_time_s", "comm_exposed_s", "speedup", "efficiency"}
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["workers"])
    assert r["replay_max_rel_diff"] < 1e-9
    assert set(r["policies"]) == {"sequential", "io-overlap", "wfbp", "fused", "mg-wfbp"}
    assert all(g >= 1 - 1e-12 for g in r["gain_over_sequential"]["wfbp"])


def test_replay_trace_with_critical_path(tmp_path, capsys):
    f = tmp_path / "net.csv"
    f.write_text(CSV)
    trace = tmp_path / "sgd.trace.json"
    r = run_json(capsys, str(f), "--workers", "1,2", "--net", "1Gbit", "--trace", str(trace))
    doc = json.loads(trace.read_text())
    names = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert "w1.i2.B.fc" in names and any(n.startswith("i0.C.") for n in names)
    cp = r["critical_path"]
    assert cp["workers"] == 2
    # the path of 3 iterations, per iteration, is the steady iteration plus a third of the first I/O + H2D
    assert cp["total_ms"] == pytest.approx(r["rows"][1]["iter_time_s"] * 1e3 + 1.2 / 3, rel=1e-9)


def test_text_output_and_svg(tmp_path, capsys):
    f = tmp_path / "net.csv"
    f.write_text(CSV)
    svg = tmp_path / "speedup.svg"
    assert main(["sgd", str(f), "--workers", "1,4", "--net", "25Gbit", "--policy", "fused", "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "policy fused" in out and "mg-wfbp" in out and "speed-up chart" in out
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg") and len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 6  # linear + 5 policies


def test_bad_layer_file_is_one_line_with_line_number(tmp_path, capsys):
    f = tmp_path / "bad.csv"
    f.write_text("layer,backward_us,grad_bytes\na,1,2\nb,fast,2\n")
    assert main(["sgd", str(f), "--net", "10gbe"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{f}: line 3: backward_us 'fast' is not a number" in err


def test_missing_cost_source_and_bad_net(tmp_path, capsys):
    f = tmp_path / "net.csv"
    f.write_text(CSV)
    assert main(["sgd", str(f), "--workers", "1,2"]) == 2
    assert "no all-reduce cost for 2 workers" in capsys.readouterr().err
    assert main(["sgd", str(f), "--net", "carrier-pigeon"]) == 2
    assert "--net 'carrier-pigeon'" in capsys.readouterr().err


def test_bcaffe_googlenet_prediction(capsys):
    r = run_json(capsys, str(DATA / "tmp8comm.log"), "--workers", "1,2,4,8", "--iter-time-1", "0.3918",
                 "--comm-log", str(DATA / "tmp2comm.log"), "--comm-log", str(DATA / "tmp4comm.log"), "--osu", str(DATA / "allreduce8.log"))
    rows = {row["workers"]: row for row in r["rows"]}
    assert rows[1]["iter_time_s"] == pytest.approx(0.3918)
    assert rows[8]["comm_source"].startswith("measured per layer")
    t = {p: [x["iter_time_s"] for x in v] for p, v in r["policies"].items()}
    # the model can only add time to the single-worker iteration, and WFBP never loses to no overlap
    for times in t.values():
        assert min(times) >= 0.3918 - 1e-9
        assert all(w <= s + 1e-12 for w, s in zip(t["wfbp"], t["sequential"]))
    assert rows[8]["comm_exposed_s"] > 0.05  # 0.31 s of measured 8-node comm cannot hide behind 0.21 s of backward


def test_unlabelled_log_predicts_from_the_network_and_says_so(capsys):
    r = run_json(capsys, str(DATA / "tmpcomm.log"), "--workers", "1,8", "--net", "10gbe", "--iter-time-1", "0.3918")
    assert r["rows"][1]["comm_source"] == "10gbe"
    assert any("worker count is unknown" in n for n in r["notes"])
    assert main(["sgd", str(DATA / "tmp8comm.log"), "--comm-log", str(DATA / "tmpcomm.log")]) == 2
    assert "cannot tell the worker count" in capsys.readouterr().err


def test_speedup_chart_skips_missing_points():
    svg = speedup_chart([1, 2, 4], {"a": [{"speedup": 1.0}, {"speedup": float("nan")}, {"speedup": 3.5}]}, title="t & <x>")
    root = ET.fromstring(svg)  # well-formed, title escaped
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert [len(p.get("points").split()) for p in lines] == [2, 3]  # "a" without its NaN, then linear


def test_link_model_from_calibrate(tmp_path, capsys):
    """A `dagprof calibrate` file prices the all-reduces at the worker count it was measured on (others ring-scaled from it)."""
    from dagprof.costmodel import AlphaBeta, ring_allreduce_us
    from dagprof.costmodel.topology import save_link_model

    f = tmp_path / "net.csv"
    f.write_text(CSV)
    link = AlphaBeta.from_bandwidth(1e9, 100.0)
    model = save_link_model(tmp_path / "link.json", link, backend="gloo", workers=2, points=[[4096, 150.0]])
    r = run_json(capsys, str(f), "--workers", "2,4", "--link-model", model)
    two, four = r["policies"]["sequential"]
    assert "link.json (calibrate), measured on 2 workers" in two["comm_source"] and "ring-scaled" in four["comm_source"]
    comm = ring_allreduce_us(__import__("numpy").array([40000.0, 4e6, 16e6]), 2, link).sum()
    assert two["comm_total_s"] == pytest.approx(comm / 1e6)
    # per worker count (nccl-tests tables) and over a bandwidth for the others
    by = save_link_model(tmp_path / "by.json", link, by_workers={4: AlphaBeta.from_bandwidth(5e8, 50.0)})
    r = run_json(capsys, str(f), "--workers", "2,4", "--link-model", by, "--net", "10Gbit")
    two, four = r["policies"]["sequential"]
    assert two["comm_source"].startswith("10Gbit") and "4 workers" in four["comm_source"]
    (tmp_path / "bad.json").write_text('{"alpha_us": 1, "beta_us_per_byte": 1e-3, "by_workers": {"x": {}}}')
    assert main(["sgd", str(f), "--link-model", str(tmp_path / "bad.json")]) == 2
    assert "bad.json" in capsys.readouterr().err


def test_jitter_needs_per_step_times(tmp_path, capsys):
    f = tmp_path / "net.csv"
    f.write_text(CSV)
    assert main(["sgd", str(f), "--net", "10gbe", "--jitter", "8"]) == 2
    assert "run folder" in capsys.readouterr().err
    assert main(["sgd", str(f), "--net", "10gbe", "--jitter", "1000000000"]) == 2
    assert "--jitter takes a sample count from 0 to 10,000" in capsys.readouterr().err


def test_rows_priced_from_different_sources_are_said(capsys):
    # tmp8comm.log's measured all-reduces price 8 workers, 10gbe the others: 16 workers came out faster than 8, unsaid
    r = run_json(capsys, str(DATA / "tmp8comm.log"), "--workers", "1,4,8,16", "--net", "10gbe")
    assert len({row["comm_source"] for row in r["rows"][1:]}) == 2
    assert any("priced from 2 different sources" in n for n in r["notes"])
    r = run_json(capsys, str(DATA / "tmp8comm.log"), "--workers", "1,4,16", "--net", "10gbe")
    assert not any("different sources" in n for n in r["notes"])
