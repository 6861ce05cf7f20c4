"""The edges a user touches: where outputs go, list flags, step windows, one-line flag errors."""
import argparse
import json
import pathlib
import shutil

import pytest

from dagprof.cli.common import comma_list, positive_int, positive_number
from dagprof.cli.main import main
from dagprof.pipeline import default_out
from dagprof.traces.steps import iteration_us, parse_steps

RUN = pathlib.Path(__file__).parent / "data" / "run_schema" / "v1"  # a real 2-rank run, steps 1 and 2


@pytest.fixture
def run_copy(tmp_path) -> pathlib.Path:
    shutil.copytree(RUN, tmp_path / "run")
    return tmp_path / "run"


def test_outputs_go_inside_a_run_folder_and_never_beside_traces(run_copy, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert default_out(run_copy) == str(run_copy)
    assert default_out("/shared/traces/job7/rank0.json.gz") == str(tmp_path / "dagprof-out" / "rank0")
    assert default_out("/shared/traces/job7/") == str(tmp_path / "dagprof-out" / "job7")
    assert main(["report", str(run_copy)]) == 0
    assert (run_copy / "report.html").exists()


def test_replay_of_a_trace_file_writes_to_dagprof_out(tmp_path, monkeypatch, capsys):
    from gloo_kineto import gloo_traces

    traces = pathlib.Path(gloo_traces())
    trace = sorted(traces.glob("*.json"))[0]
    before = {p.name for p in traces.iterdir()}
    monkeypatch.chdir(tmp_path)
    assert main(["replay", str(trace), "--json"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    out = tmp_path / "dagprof-out" / trace.name.removesuffix(".json")
    assert {pathlib.Path(p).parent for p in files.values()} == {out}
    assert {p.name for p in traces.iterdir()} == before  # nothing of ours beside the input, not even the parse cache


def test_one_list_flag_parser():
    ints = comma_list(positive_int)
    assert ints("4, 16,,4,4096") == [4, 16, 4096]  # order kept, blanks and repeats dropped
    assert comma_list(positive_number)("0.5,inf") == [0.5, float("inf")]
    for bad in ("", " , ", "4,x", "0", "-2"):
        with pytest.raises(argparse.ArgumentTypeError):
            ints(bad)


@pytest.mark.parametrize("argv, flag", [
    (["whatif", str(RUN), "--workers", "4,x"], "--workers"),
    (["whatif", str(RUN), "--bandwidth", "10Gbit,fast"], "--bandwidth"),
    (["sgd", str(RUN), "--workers", "0"], "--workers"),
    (["optimize", str(RUN), "--bucket-mb", "1,-3"], "--bucket-mb"),
    (["analyze", str(RUN), "--steps", "2:1"], "--steps"),
    (["replay", str(RUN), "--no-such-flag"], "--no-such-flag"),
])
def test_a_wrong_flag_is_one_line_and_status_2(capsys, argv, flag):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and err[0].startswith("dagprof")


def test_a_number_is_one_step_everywhere(capsys):
    assert parse_steps("2") == parse_steps(2) == range(2, 3) and parse_steps("1:3") == range(1, 3)
    assert main(["analyze", str(RUN), "--steps", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == [2]


def test_iteration_time_is_the_mean_start_to_start():
    assert iteration_us([[0, 0, 9], [1, 10, 19], [2, 20, 31]]) == pytest.approx(31 / 3)  # gaps count, as the replay keeps them
    assert iteration_us([[5, 0, 9], [7, 20, 29]]) == 9  # not consecutive: each counts to its own end
    assert iteration_us([10, 20, 60]) == 30  # durations of back-to-back steps: their mean, slow steps included
