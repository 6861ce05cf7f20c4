"""The benches' offline judges that evidence figures rest on: ``bench_frameworks.py --judge`` (kept runs judged again, no
job) and ``compare_outputs.py --notes`` (each command's longest line, and the numbers of its ``--json`` answer)."""
from __future__ import annotations

import io
import json
import os
import pathlib
import sys

from testdata import DATA

from dagprof.pipeline import open_run

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from bench_frameworks import JUDGED, _summary, judge_kept  # noqa: E402
from compare_outputs import NOTE_COMMANDS, NOTE_RUNS, differences, note_argv, numbers  # noqa: E402


def test_judge_kept_says_a_line_a_run_with_the_replays_error_and_a_refusal_in_one_line(tmp_path):
    run, empty = str(DATA / "mxnet"), str(tmp_path)
    said = io.StringIO()
    got = judge_kept([run, empty], said)
    lines = said.getvalue().splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [run, empty]
    first = json.loads(lines[0].split(": ", 1)[1])
    assert set(first) <= set(JUDGED) and "model_pct" in first and "refused" not in first
    assert got[run]["replay_pct"] == open_run(run).analysis.error_pct  # the replay's error is the pipeline's own
    assert set(got[empty]) == {"refused"} and "\n" not in got[empty]["refused"]


def test_notes_compare_numbers_not_wording():
    a = {"notes": ["a long note"], "scenarios": [{"predicted_iter_ms": 10.0, "label": "x"}], "detail": {"why": "said so"}}
    b = {"notes": ["short"], "scenarios": [{"predicted_iter_ms": 10.0, "label": "y"}], "detail": {"why": "said"}}
    assert differences(a, b) and not differences(numbers(a), numbers(b))
    b["scenarios"][0]["predicted_iter_ms"] = 10.5
    assert differences(numbers(a), numbers(b)) == [".scenarios[0].predicted_iter_ms: 10.0 -> 10.5"]


def test_note_commands_name_their_run_and_write_only_in_the_work_folder(tmp_path):
    tree = pathlib.Path("/x/before")
    assert note_argv("diff", "tf/fit", tmp_path, tree) == ["diff", "tf/fit", "tf/fit"]
    assert note_argv("report", "tf/fit", tmp_path, tree) == ["report", "tf/fit", "-o", str(tmp_path / "report-before" / "tf/fit")]
    assert note_argv("workers", "tf/fit", tmp_path, tree)[:4] == ["whatif", "tf/fit", "--workers", "4"]
    assert all((DATA / run).is_dir() for run in NOTE_RUNS) and len(NOTE_COMMANDS) == 11


def test_a_hogged_profile_is_judged_apart_where_others_loaded_the_measured_job():
    def row(k, measured_foreign, err):
        return {"round": k, "profiled": {"load": 1.0, "foreign_pct": 1.0}, "other": {"load": 1.0, "foreign_pct": measured_foreign},
                "hogged": {"load": 1.0, "foreign_pct": 49.0}, "hogged_error_pct": err}
    got = _summary([row(0, 2.0, 5.0), row(1, 39.0, -56.0)], {"rate_bit": 1e9, "other_rate_bit": 2e8, "why": "given"})
    assert got["hogged_error_pct"]["median"] == -25.5 and got["hogged_error_pct"]["within_8"] == 1
    assert got["hogged_quiet_error_pct"] == {"median": 5.0, "spread": [5.0, 5.0], "within_8": 1}
