"""``bench/fsdp_fresh/judge_pairs.py`` on the vendored LoRA pairs (``tests/data/lora``): each pair judged as ``dagprof whatif
--data-parallel fsdp`` predicts it against the FSDP profile's own step, its interval held against the FSDP job's median
unprofiled step, and the summary counts what it judged (no timing)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from testdata import DATA, cli_json

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "bench", "fsdp_fresh", "judge_pairs.py")
SRC = os.path.join(os.path.dirname(__file__), "..", "src")


def _whatif(capsys, *args: str) -> dict:
    """``dagprof whatif`` in this process (the script runs it on the same src): no interpreter and import per call."""
    rc, doc, err = cli_json(capsys, "whatif", *args, "--no-trace", "--allow-model-error", "--json")
    assert rc == 0, err
    return doc


def test_the_lora_pairs_judged_as_whatif_predicts_them(capsys):
    done = subprocess.run([sys.executable, SCRIPT, "--src", SRC, "--json", str(DATA / "lora")], capture_output=True, text=True, check=True)
    out = json.loads(done.stdout)
    assert [os.path.basename(r["ddp"]) for r in out["rows"]] == ["ddp-0", "ddp-1"]
    row = out["rows"][0]
    job = _whatif(capsys, str(DATA / "lora" / "fsdp-0"))
    measured, unprofiled = job["measured_iter_ms"], job["profiler_cost"]["unprofiled_step_ms"]
    scenario = _whatif(capsys, str(DATA / "lora" / "ddp-0"), "--data-parallel", "fsdp")["scenarios"][0]
    predicted = scenario["predicted_iter_ms"]
    assert row["measured_ms"] == measured and row["predicted_ms"] == predicted
    assert row["error_pct"] == 100.0 * (predicted / measured - 1.0)
    # the interval is for the job's median unprofiled step: held against it, around the replayed steps' median
    assert unprofiled is not None and row["unprofiled_ms"] == unprofiled
    assert (row["lo_ms"], row["hi_ms"], row["predicted_median_ms"]) == (scenario["lo_ms"], scenario["hi_ms"], scenario["predicted_median_ms"])
    assert row["inside_unprofiled"] == (scenario["lo_ms"] <= unprofiled <= scenario["hi_ms"])
    assert row["width_pct"] == 100.0 * (scenario["hi_ms"] - scenario["lo_ms"]) / scenario["predicted_median_ms"]
    assert row["terms"] == scenario["interval_basis"]["terms"]
    s = out["summary"]
    assert s["pairs"] == s["judged"] == 2 and s["within_8"] == sum(abs(r["error_pct"]) <= 8 for r in out["rows"])
    assert s["judged_unprofiled"] == 2 and s["inside_unprofiled"] == sum(r["inside_unprofiled"] for r in out["rows"])


def test_a_folder_without_pairs_is_refused_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode != 0 and done.stderr.strip().count("\n") == 0 and "no DDP:FSDP pair" in done.stderr


def test_the_floor_holds_both_cells_against_the_later_unprofiled_jobs(tmp_path, capsys):
    """Where a round ran both configurations again unprofiled afterwards (``pairs_hold.sh``'s ``*.after.log``), the
    conversion's replayed median and the target's own profile replayed unchanged are both held against that later job;
    a pair without them keeps its rows as before."""
    import shutil

    shutil.copytree(DATA / "lora", tmp_path / "lora")
    (tmp_path / "lora" / "fsdp-0.after.log").write_text("noise\nfsdp median step 50.0 ms\n")
    (tmp_path / "lora" / "ddp-0.after.log").write_text("ddp median step 20.0 ms\n")
    for to, target, other, after in (("fsdp", "fsdp-0", "ddp-0", 50.0), ("ddp", "ddp-0", "fsdp-0", 20.0)):
        done = subprocess.run([sys.executable, SCRIPT, "--src", SRC, "--to", to, "--json", str(tmp_path / "lora")],
                              capture_output=True, text=True, check=True)
        out = json.loads(done.stdout)
        row, bare = out["rows"]
        converted = _whatif(capsys, str(tmp_path / "lora" / other), "--data-parallel", to)["scenarios"][0]["predicted_median_ms"]
        same = _whatif(capsys, str(tmp_path / "lora" / target))["scenarios"][0]["predicted_median_ms"]
        assert row["after_ms"] == after and row["identity_ms"] == same
        assert row["after_error_pct"] == 100.0 * (converted / after - 1.0)
        assert row["identity_error_pct"] == 100.0 * (same / after - 1.0)
        assert "after_ms" not in bare and "identity_error_pct" not in bare
        s = out["summary"]
        assert s["judged_after"] == 1 and s["identity_after"]["median_miss_pct"] == abs(row["identity_error_pct"])
        assert s["conversion_after"]["signed_median_pct"] == row["after_error_pct"]
