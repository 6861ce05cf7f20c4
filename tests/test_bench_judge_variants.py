"""``bench/fsdp_fresh/judge_variants.py`` on vendored pairs and a vendored DDP profile (fixed recordings, no timing): its base rows
are ``judge_pairs.py``'s, a set's halves alternate by position and a rerun skips what is judged, and the ``rqW`` variant adds
each blocking call's wake-ups at the DDP profile's run-queue wait per run beyond W us, which can only lengthen the step."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from testdata import DATA

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench", "fsdp_fresh")
SCRIPT = os.path.join(BENCH, "judge_variants.py")
SRC = os.path.join(os.path.dirname(__file__), "..", "src")
sys.path.insert(0, BENCH)

import judge_variants  # noqa: E402

from dagprof.passes import data_parallel  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=SRC))


def test_base_rows_are_judge_pairs_rows_and_a_rerun_skips_the_judged(tmp_path):
    out = str(tmp_path / "rows.jsonl")
    assert _run(out, "--half", "dev", "--variants", "base", f"lora={DATA / 'lora'}").returncode == 0
    assert [json.loads(x)["half"] for x in open(out)] == ["dev"]  # position 0 develops, 1 is held out
    assert _run(out, "--variants", "base", f"lora={DATA / 'lora'}").returncode == 0
    rows = [json.loads(x) for x in open(out)]
    assert [(r["k"], r["half"], os.path.basename(r["ddp"])) for r in rows] == [(0, "dev", "ddp-0"), (1, "held", "ddp-1")]
    done = subprocess.run([sys.executable, os.path.join(BENCH, "judge_pairs.py"), "--src", SRC, "--json", str(DATA / "lora")],
                          capture_output=True, text=True, check=True)
    for mine, theirs in zip(rows, json.loads(done.stdout)["rows"]):
        for key in ("unprofiled_ms", "predicted_median_ms", "lo_ms", "hi_ms", "inside_unprofiled", "width_pct"):
            assert mine["base"][key] == pytest.approx(theirs[key], rel=1e-12), key
    table = _run("--table", out)
    assert table.returncode == 0 and "== base" in table.stdout and "2 of 2 inside" in table.stdout


def test_the_run_queue_variant_prices_each_wake_up_beyond_the_quiet_wait():
    g = open_run(DATA / "lora-clip" / "ddp-0").graph  # records how often the training thread got a core
    queue = data_parallel.run_queue_wake(g)
    assert data_parallel.priced_wake_up(g, None) is None  # the tree: each call's measured cost holds its wake-ups
    with judge_variants.variant("rq70"):
        priced = data_parallel.priced_wake_up(g, None)
    assert queue is not None and priced.us == {r: max(0.0, u - 70.0) for r, u in queue.us.items()}
    assert data_parallel.priced_wake_up(g, None) is None  # restored
    points = {}
    for v in ("base", "rq70", "rq0"):
        with judge_variants.variant(v):
            points[v] = judge_variants.whatif(str(DATA / "lora-clip" / "ddp-0"), "--data-parallel", "fsdp")["scenarios"][0]["predicted_median_ms"]
    assert points["base"] <= points["rq70"] <= points["rq0"]  # more added to each blocking call's issue and wait, never a shorter step


def test_bad_arguments_are_refused_in_one_line(tmp_path):
    for args, said in (([str(tmp_path / "o.jsonl"), "--variants", "nope", f"lora={DATA / 'lora'}"], "unknown variant"),
                       ([str(tmp_path / "o.jsonl"), f"none={tmp_path / 'missing*'}"], "no folder matches")):
        done = _run(*args)
        assert done.returncode != 0 and done.stderr.strip().count("\n") == 0 and said in done.stderr
