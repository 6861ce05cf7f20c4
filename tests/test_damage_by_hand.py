"""Damages users make by hand (``bench/damage_more.py`` audits them on every reader), one check per fix.

Each was read before with exit 0 and a wrong or unflagged number, or failed as an internal error: a step of ten
hours averaged in unsaid, a Kineto trace in ns, a dagprof run's Kineto trace of another world size, a Horovod
timeline holding a second session, an MXNet trace written twice or a manifest whose num_workers disagrees with its
traces (KeyError), an output path that is a folder or lies under a file, a link that loops.
Every copy is made in the test from the fixture; nothing under tests/data changes.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from testdata import DATA, cli_json, copy_fixture, edit_json, load_refused

from dagprof.traces.steps import STALL_FACTOR, stalled_steps

HOUR_US = 3_600_000_000



def test_a_step_of_ten_hours_is_said(tmp_path, capsys):
    run = copy_fixture(tmp_path, "ddp-testbed/run")

    def stall(doc):  # rank 1 stalls ten hours in step 9: every later time moves on
        rows = doc["step_times_ns"]
        cut = next((a + b) // 2 for s, a, b in rows if s == 9)
        for row in rows:
            row[1] += 10 * HOUR_US * 1000 if row[1] > cut else 0
            row[2] += 10 * HOUR_US * 1000 if row[2] > cut else 0
        for key in ("records", "enqueues"):
            for row in doc.get(key) or []:
                row[3] += 10 * HOUR_US * 1000 if row[3] > cut else 0
    edit_json(run / "rank1.json", stall)
    rc, doc, _ = cli_json(capsys, "analyze", "--json", str(run))
    assert rc == 0
    said = [w for w in doc["warnings"] if f"{STALL_FACTOR:.0f}x the median step" in w]
    assert said and "rank 1, step 9: 36000" in said[0], doc["warnings"]


def _spans(periods_us: list[float]) -> list[list[float]]:
    starts = [sum(periods_us[:k]) for k in range(len(periods_us))]
    return [[k, a, a + p] for k, (a, p) in enumerate(zip(starts, periods_us))]


def test_steady_steps_and_a_straggler_are_not_stalls():
    assert stalled_steps({0: _spans([200e3] * 8), 1: _spans([195e3] * 8)}) is None
    straggler = [200e3] * 8
    straggler[3] = 25 * 200e3  # a straggler or a collector pause: real cost, no stall
    assert stalled_steps({0: _spans(straggler), 1: _spans(straggler)}) is None
    straggler[3] = 2 * STALL_FACTOR * 200e3
    assert "rank 0, step 3" in stalled_steps({0: _spans(straggler), 1: _spans([200e3] * 8)})
    assert "rank 0, step 0" in stalled_steps({0: [[0, 0, 100e6]], 1: [[0, 0, 100e3]]})  # one step each: the shorter is the median
    assert stalled_steps({0: [[1, 0, 9288], [2, 9325, 9374]]}) is None  # one rank's two steps, the last cut by the window's end


def test_a_kineto_trace_in_ns_isload_refused(tmp_path):
    path = tmp_path / "nccl_data.json.gz"
    shutil.copy(DATA / "kineto-public/nccl_parser_config/nccl_data.json.gz", path)

    def ns(doc):
        for e in doc["traceEvents"]:
            for k in ("ts", "dur"):
                if isinstance(e.get(k), (int, float)):
                    e[k] *= 1000
    edit_json(path, ns)
    load_refused(path, str(path), "times in ns where Kineto writes us")  # read before as a job 1000x slower, exit 0


def test_a_dagprof_runs_kineto_trace_of_another_world_size_isload_refused(tmp_path):
    run = copy_fixture(tmp_path, "hybrid-dp-tp-dagprof")
    edit_json(run / "rank1.kineto.json.gz", lambda d: d["distributedInfo"].update(world_size=6))
    load_refused(run, "rank1.kineto.json.gz", "world_size 6, but the rank file is of a 4-rank job")


def test_a_horovod_timeline_with_a_second_session_isload_refused(tmp_path):
    run = copy_fixture(tmp_path, "horovod/sparse-gru")
    tl = run / "horovod_timeline.json"
    events = json.loads(tl.read_text())
    again = json.loads(json.dumps(events))
    for e in again:
        if "start_time_since_epoch_in_micros" in e.get("args", {}):
            e["args"]["start_time_since_epoch_in_micros"] += HOUR_US
    tl.write_text(json.dumps(events + again))  # read before with a 20-minute all-reduce, exit 0
    load_refused(run, str(tl), "a second timeline session")


def test_a_horovod_timeline_with_events_appended_an_hour_on_isload_refused(tmp_path):
    run = copy_fixture(tmp_path, "horovod/sparse-gru")
    tl = run / "horovod_timeline.json"
    events = json.loads(tl.read_text())
    events += json.loads(json.dumps([e for e in events if "ts" in e]))
    for e in events[len(events) // 2:]:  # the last response opened in the window closes an hour on
        e["ts"] = e["ts"] + HOUR_US if "ts" in e else e.get("ts")
    tl.write_text(json.dumps([{k: v for k, v in e.items() if v is not None} for e in events]))
    load_refused(run, str(tl), "end up to 3600 s after them")  # read before with a 20-minute all-reduce in a step, exit 0


def test_an_mxnet_trace_written_twice_isload_refused(tmp_path):
    run = copy_fixture(tmp_path, "mxnet/user_mlp")
    edit_json(run / "worker1.json.gz", lambda d: d.update(traceEvents=[e for e in d["traceEvents"] for _ in (0, 1)]))
    load_refused(run, "worker1.json.gz", "operator spans appear twice")  # read before 0.2 % slower, exit 0


@pytest.mark.parametrize("fixture", ["ddp-testbed/run", "fsdp/reshard"])
def test_a_rank_file_with_its_records_written_twice_isload_refused(tmp_path, fixture):
    run = copy_fixture(tmp_path, fixture)  # DDP: "mismatched collectives" on the folder before; FSDP: read as it was, unsaid
    edit_json(run / "rank1.json", lambda d: d.update(records=[r for r in d["records"] for _ in (0, 1)]))
    load_refused(run, str(run / "rank1.json"), "hook records appear twice")


def test_a_horovod_rank_file_of_another_world_size_isload_refused(tmp_path):
    run = copy_fixture(tmp_path, "horovod/sparse-gru")
    edit_json(run / "rank1.horovod.json", lambda d: d.update(world_size=4))  # read before as this job's, exit 0
    load_refused(run, str(run / "rank1.horovod.json"), "holds rank 1 of 4, not of 2")


@pytest.mark.parametrize("workers", [1, 3])
def test_an_mxnet_manifest_whose_num_workers_disagrees_isload_refused(tmp_path, workers):
    run = copy_fixture(tmp_path, "mxnet/user_mlp")
    edit_json(run / "mxnet-run.json", lambda d: d.update(num_workers=workers))  # 3: KeyError (exit 3) before
    load_refused(run, "mxnet-run.json", f"num_workers is {workers} but the traces listed are of workers [0, 1]")


def test_an_output_path_that_is_a_folder_or_under_a_file_isload_refused(tmp_path, capsys):
    log = str(DATA / "bcaffe-k80-googlenet/tmp4comm.log")
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    for flag, path, needle in [("--svg", tmp_path / "adir", "is a folder"), ("--trace", tmp_path / "afile" / "x.json", "is a file")]:
        rc, _, err = cli_json(capsys, "sgd", log, "--workers", "4", "--net", "10gbe", flag, str(path))
        assert rc == 2 and needle in err and "internal error" not in err, err  # exit 3 before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]


def test_a_looping_link_is_said(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    load_refused(loop, str(loop), "symbolic link to nothing")


def test_unicode_op_names_print_to_an_ascii_stdout(tmp_path):
    run = copy_fixture(tmp_path, "gloo-windows/same")
    for p in run.glob("*.json.gz"):
        edit_json(p, lambda d: [e.update(name=e["name"] + " ünï✓") for e in d["traceEvents"] if e.get("cat") == "cpu_op"
                            and e.get("name", "").startswith("aten::")])
    src = str(pathlib.Path(__file__).parents[1] / "src")
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "dagprof.cli.main", "analyze", str(run)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]  # UnicodeEncodeError before
    assert "\\xfcn\\xef\\u2713" in p.stdout
