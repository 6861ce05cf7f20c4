"""The commands as a user runs them: JSON on stdout, one-line errors with exit status 2."""
import gzip
import json
import os

import pytest
from testdata import DATA, KINETO_PUBLIC

from dagprof.cli.main import main

NCCL = str(KINETO_PUBLIC / "nccl_parser_config" / "nccl_data.json.gz")


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_replay_json_on_a_stock_gpu_trace(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "replay", NCCL, "--json", "-o", str(tmp_path))
    assert code == 0
    r = json.loads(out)
    assert abs(r["error_pct"]) < 5  # issue 3: replayed within 5 % of the measured step
    assert r["per_rank"][0]["rank"] == 0
    assert os.path.exists(tmp_path / "replay.trace.json") and os.path.exists(tmp_path / "report.html")
    trace = json.load(open(tmp_path / "replay.trace.json"))
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])


def test_analyze_text_names_findings(capsys):
    code, out, _ = run_cli(capsys, "analyze", NCCL)
    assert code == 0
    assert "critical path" in out and "findings:" in out


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda d: str(d / "nope"), "no such file or folder"),
        (lambda d: _write(d / "t.json.gz", gzip.compress(b'{"traceEvents": [{"ph": "X", "na')), "t.json.gz"),
        (lambda d: _write(d / "x.json", b'{"hello": 1}'), "x.json"),
        (lambda d: str(d), "no torch.profiler traces"),
    ],
)
def test_bad_input_is_one_line_error(capsys, tmp_path, make, problem):
    code, out, err = run_cli(capsys, "replay", make(tmp_path))
    assert code == 2
    assert problem in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_flag_value(capsys):
    assert main(["replay", NCCL, "--steps", "9:3"]) == 2
    err = capsys.readouterr().err
    assert "--steps" in err and len(err.strip().splitlines()) == 1


def test_error_in_json_mode_is_a_json_object(capsys, tmp_path):
    code, out, err = run_cli(capsys, "replay", str(tmp_path / "missing"), "--json")
    assert code == 2
    assert "no such file" in json.loads(out)["error"]


def test_one_rank_file_of_a_larger_job_is_warned_and_whatif_refuses(capsys, tmp_path):
    # nccl_data.json.gz is rank 0 of a 2-rank job: read as that rank alone, said with the count; a what-if (which re-prices
    # collectives across ranks) refused in one line instead of "graph is already folded"
    code, out, err = run_cli(capsys, "analyze", NCCL, "--json")
    r = json.loads(out)
    assert code == 0 and r["partial"] is True and any("rank 0 of a 2-rank job, the other 1 rank(s) not read" in w for w in r["warnings"])
    code, out, err = run_cli(capsys, "whatif", NCCL, "--bandwidth", "1Gbit", "-o", str(tmp_path))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "nccl_data.json.gz: holds rank 0 of a 2-rank job alone" in err


def test_the_whatif_api_on_a_lone_later_rank_refuses_in_one_line_not_a_value_error():
    # the CLI refuses a lone rank's file up front; the API's evaluate reached the one-worker replica, which keeps rank 0 only,
    # and failed on max() of no ranks
    from dagprof.errors import DagprofError
    from dagprof.pipeline import open_run
    from dagprof.search.scenario import Scenario
    from dagprof.search.whatif import evaluate

    path = KINETO_PUBLIC.parent / "gloo-windows" / "same" / "rank-1.pt.trace.json.gz"
    g = open_run(str(path), template=True).graph
    with pytest.raises(DagprofError, match="no rank of the replayed graph spans a step"):
        evaluate(g, [Scenario(bandwidth="100Mbit")], tolerance_pct=None)


def test_whatif_without_an_axis_says_the_row_is_the_profiled_setup(capsys, tmp_path):
    run = KINETO_PUBLIC.parent / "ddp-testbed" / "run"
    code, out, _ = run_cli(capsys, "whatif", str(run), "--no-trace", "--json", "-o", str(tmp_path))
    r = json.loads(out)
    assert code == 0 and len(r["scenarios"]) == 1 and r["notes"][0].startswith("no what-if asked")
    code, out, _ = run_cli(capsys, "whatif", str(run), "--no-trace", "--json", "--workers", "4", "-o", str(tmp_path))
    assert code == 0 and not any("no what-if asked" in n for n in json.loads(out)["notes"])


def test_optimize_without_buckets_is_a_clear_error(capsys):
    code, _, err = run_cli(capsys, "optimize", NCCL)
    assert code == 2 and "no gradient-bucket all-reduce" in err


def test_python_m_dagprof_runs_the_command(tmp_path):
    """``python -m dagprof`` is what a user without the script on PATH tries first: the command itself, its exit status
    passed through (it was "'dagprof' is a package and cannot be directly executed")."""
    import subprocess
    import sys

    run = str(DATA / "mxnet")
    out = subprocess.run([sys.executable, "-m", "dagprof", "replay", run, "--json", "--out", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "iteration" in out.stdout or "error_pct" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "dagprof", "replay", run + "-missing"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
