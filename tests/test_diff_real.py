"""``dagprof diff`` on real 2-rank gloo DDP profiles that differ in one known way.

The base is the session's shared run of the tiny demo model (conftest); each variant is the same
job with one change (bench/diff_workload.py): one layer's forward sleeps on every rank, or on
rank 1 only (a straggler). Another training is a vendored real 2-rank gloo DDP profile of a DQN
(tests/data/ddp-fresh/dqn-loaded): recording an MLP here cost a job and checked the same refusal.
The demo model itself is recorded with DDP's default 25 MB buckets and with 2 MB ones, as
``dagprof demo`` and its search would run it.
The sleep (100 ms per step) is far above what a loaded 2-core machine adds to one op of this model,
so the assertions hold for any valid recording; none bounds a time.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from diff_workload import Variant, record  # noqa: E402
from test_diff import check_books  # noqa: E402
from testdata import DATA  # noqa: E402

from dagprof.analysis.diff import diff_profiles  # noqa: E402
from dagprof.cli.main import main  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.traces.events import Kind  # noqa: E402

LAYER = "layers.1.conv2"
SLOW_MS = 100.0


@pytest.fixture(scope="module")
def runs(small_ddp_run, tmp_path_factory) -> dict[str, str]:
    variants = {
        "slow": Variant(slow_layer=LAYER, slow_ms=SLOW_MS),
        "straggler": Variant(slow_layer=LAYER, slow_ms=SLOW_MS, slow_rank=1),
    }
    recorded = {k: record(v, tmp_path_factory.mktemp(k)) for k, v in variants.items()}
    return {"base": small_ddp_run, "other": str(DATA / "ddp-fresh" / "dqn-loaded")} | recorded


@pytest.fixture(scope="module")
def base(runs):
    return open_run(runs["base"])


def test_a_slowed_layer_is_where_the_change_is(runs, base):
    d = diff_profiles(base, open_run(runs["slow"]))
    check_books(d)
    # the forward part carries the sleep; on a loaded machine the waits in communication can move as much, so it need
    # not rank first
    forward = next(p for p in d.attribution.parts if p.label == "forward")
    assert forward.delta_us > 0.5 * SLOW_MS * 1e3 and forward.breakdown_by == "layer"
    assert forward.breakdown[0].label == LAYER and forward.breakdown[0].delta_us > 0.5 * SLOW_MS * 1e3
    assert {(o.rank, o.label) for o in d.top_ops[:2]} == {(0, f"{LAYER} forward"), (1, f"{LAYER} forward")}
    assert d.b.op_time_us["forward"] - d.a.op_time_us["forward"] > 0.5 * SLOW_MS * 1e3
    assert d.match.fraction_a > 0.9 and d.match.fraction_b > 0.9


def test_a_straggler_rank_is_named_and_the_other_waits(runs, base):
    b = open_run(runs["straggler"])
    d = diff_profiles(base, b)
    check_books(d)
    forward = d.attribution.parts[0]
    assert forward.label == "forward" and forward.by_rank[0].label == "rank 1" and forward.breakdown[0].label == LAYER
    assert (d.top_ops[0].rank, d.top_ops[0].label) == (1, f"{LAYER} forward")
    waits = {r.rank: r.wait_us / b.analysis.steps for r in b.analysis.ranks}
    assert waits[0] > waits[1] and waits[0] > 0.25 * SLOW_MS * 1e3  # rank 0 waits for rank 1 at the collectives


@pytest.fixture(scope="module")
def demo_pair(tmp_path_factory) -> tuple[str, str]:
    """The demo model as ``dagprof demo`` profiles it (DDP's default 25 MB buckets) and with 2 MB buckets."""
    from dagprof.collect.jobs.demo_train import run_demo_training

    return tuple(run_demo_training(tmp_path_factory.mktemp(f"demo{cap:g}"), steps=6, profile_steps=(2, 5), bucket_cap_mb=cap)
                 for cap in (25.0, 2.0))


def test_demo_default_against_smaller_buckets_is_structure(demo_pair):
    a, b = (open_run(p) for p in demo_pair)
    d = diff_profiles(a, b)
    check_books(d)
    assert len(d.a.bucket_bytes) == 1 and len(d.b.bucket_bytes) > 2 and sum(d.b.bucket_bytes) == d.a.bucket_bytes[0]
    assert any("gradient buckets differ" in n for n in d.notes)
    for g, nodes in ((d.a.analysis.graph, d.match.only_a), (d.b.analysis.graph, d.match.only_b)):
        kinds = set(g.kind[nodes].tolist())
        assert Kind.FORWARD not in kinds and Kind.BACKWARD not in kinds  # every layer's work has its counterpart
        assert Kind.COMM_ENQUEUE in kinds and Kind.COMM in kinds  # the buckets' all-reduces do not
    assert d.attribution.structure_us == pytest.approx(d.b.replayed_us - d.attribution.all_matched_us)
    ga, pa = d.a.analysis.graph, d.match.pairs[:, 0]
    matched_comm = pa[np.isin(ga.kind[pa], (Kind.COMM, Kind.COMM_ENQUEUE))]
    assert (ga.bucket[matched_comm] < 0).all()  # only the buffer broadcasts pair up; no bucket is timed against another


def test_cli_terminal_json_and_report(runs, tmp_path, capsys):
    out = tmp_path / "diff"
    assert main(["diff", runs["base"], runs["slow"], "-o", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    # the forward part carries the change (its size and rank: the first test); loaded, communication may rank above it
    assert "forward" in {p["label"] for p in r["attribution"]["parts"]} and "forward" in {c["category"] for c in r["categories_ms"]}
    html = (out / "diff.html").read_text()
    assert "attribution by replay" in html and LAYER in html and "<svg" in html
    trace = json.loads((out / "diff.trace.json").read_text())
    procs = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert {"A: rank 0", "A: rank 1", "B: rank 0", "B: rank 1"} <= procs
    assert main(["diff", runs["base"], runs["slow"], "--no-report"]) == 0
    text = capsys.readouterr().out
    assert "attribution by replay" in text and LAYER in text and "= measured change" in text


def test_cli_unrelated_trainings_one_line_error(runs, capsys):
    capsys.readouterr()
    assert main(["diff", runs["base"], runs["other"], "--no-report"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not profiles of the same training" in err and "% of A's ops" in err


def test_stock_torch_profiler_folders(tmp_path):
    """Two runs of a plain torch.profiler job (no dagprof inside): trace folders diff like run folders. One is the
    machine's kept recording of the job (``gloo_traces``, which the alignment tests use), the other recorded here."""
    import gloo_kineto

    gloo_kineto.record(str(tmp_path), "same")
    d = diff_profiles(open_run(gloo_kineto.gloo_traces("same")), open_run(tmp_path))
    check_books(d)
    assert d.match.fraction_a > 0.9 and d.match.fraction_b > 0.9
    assert {p.label for p in d.attribution.parts} >= {"forward", "backward"}
