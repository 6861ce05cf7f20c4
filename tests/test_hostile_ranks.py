"""Never a silent wrong answer about which ranks a run holds (issue 17, items 1, 2 and 13).

- a folder of Kineto traces or a dagprof run folder that lacks a rank is refused in one line naming
  the folder and the ranks, unless ``--allow-missing-ranks`` (then warned, counted, marked partial);
- a rank file that holds another rank (a copy), or two files of one rank, are refused in one line;
- a real gloo DDP job in which one rank is killed inside the profiled window (SIGKILL, SIGTERM,
  SIGINT; 2 and 3 ranks; ``dagprof.profile`` and the zero-code launcher) keeps every step the ranks
  completed, and ``dagprof replay`` says which rank and which steps are missing.
"""
from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import pytest
from testdata import DATA, copy_fixture, edit_json, load_refused

from dagprof.cli.main import main
from dagprof.traces import run_schema as rs
from dagprof.traces.load import load

DLRM = DATA / "kineto-corpus" / "param" / "dlrm_kineto"
TESTS = pathlib.Path(__file__).parent
SRC = TESTS.parent / "src"



def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- item 1: a rank's trace missing

@pytest.fixture
def dlrm_without_rank3(tmp_path):
    folder = tmp_path / "dlrm"
    shutil.copytree(DLRM, folder)
    os.remove(next(folder.glob("worker3_*")))
    return folder


def test_kineto_folder_missing_one_of_eight_is_refused_then_partial_on_request(dlrm_without_rank3, capsys):
    load_refused(dlrm_without_rank3, str(dlrm_without_rank3), "rank 3 of 8: no trace file here", "--allow-missing-ranks")
    code, out, err = _cli(capsys, "replay", dlrm_without_rank3, "-o", dlrm_without_rank3.parent / "out")
    assert code == 2 and "rank 3 of 8" in err and not out
    code, out, _ = _cli(capsys, "replay", dlrm_without_rank3, "-o", dlrm_without_rank3.parent / "out", "--allow-missing-ranks", "--json")
    r = json.loads(out)
    assert code == 0 and r["partial"] is True
    assert any("1 of 8 ranks missing" in w and "rank 3 of 8" in w for w in r["warnings"])
    assert sorted(row["rank"] for row in r["per_rank"]) == [0, 1, 2, 4, 5, 6, 7]


def test_complete_kineto_folder_is_not_partial(capsys, tmp_path):
    code, out, _ = _cli(capsys, "replay", DLRM, "-o", tmp_path, "--json")
    r = json.loads(out)
    assert code == 0 and r["partial"] is False and not any("partial" in w for w in r["warnings"])


def test_kineto_folder_one_of_two(tmp_path):
    from gloo_kineto import gloo_traces

    folder = tmp_path / "two"
    folder.mkdir()
    for f in glob.glob(f"{gloo_traces()}/*.json"):
        if "rank-1" not in os.path.basename(f):
            shutil.copy(f, folder)
    load_refused(folder, "rank 1 of 2: no trace file here")
    run = load(folder, allow_missing_ranks=True)
    assert [t.rank for t in run.ranks] == [0] and run.meta.partial


def _dlrm_edited(tmp_path, worker: int, **info) -> tuple[pathlib.Path, str]:
    """A copy of the 8-rank DLRM traces whose ``worker``'s trace says ``info`` in its distributedInfo; the folder, that file's name."""
    folder = copy_fixture(tmp_path, "kineto-corpus/param/dlrm_kineto")
    path = next(folder.glob(f"worker{worker}_*"))
    edit_json(path, lambda doc: doc["distributedInfo"].update(info))
    return folder, path.name


def test_kineto_traces_that_disagree_on_the_world_size(tmp_path):
    folder, name = _dlrm_edited(tmp_path, 5, world_size=16)
    load_refused(folder, "disagree on the world size", f"{name}: 16", "not one job")


def test_another_jobs_trace_beside_a_rank_is_not_an_earlier_run(tmp_path):
    """Rank 0 of a 2-rank job dropped into an 8-rank job's folder was read as the "latest run" of rank 0 and the folder
    refused as "rank 1 of 2: no trace file here" (or, with --allow-missing-ranks, analysed as that one file)."""
    folder = tmp_path / "dlrm"
    shutil.copytree(DLRM, folder)
    shutil.copy(DATA / "kineto-public" / "nccl_parser_config" / "nccl_data.json.gz", folder)
    load_refused(folder, "disagree on the world size (nccl_data.json.gz: 2, worker0_", ": 8 and 7 more)", "not one job")


GLOO = DATA / "gloo-windows"


@pytest.mark.parametrize("case", ["another run", "clock hours off"])
def test_kineto_rank_from_another_run_isload_refused(tmp_path, case):
    """A folder of stock traces took rank 1 from another recording of the job (62 s later) or a rank 3 hours off: it was
    matched by its collectives, renumbered and replayed (exit 0, another iteration time); dagprof run folders refused it."""
    folder = tmp_path / "mixed"
    shutil.copytree(GLOO / "same", folder)
    if case == "another run":
        shutil.copy(GLOO / "late-start" / "rank-1.pt.trace.json.gz", folder)
    else:
        def hours_off(doc):
            for e in doc["traceEvents"]:
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] += 3 * 3600e6

        edit_json(folder / "rank-1.pt.trace.json.gz", hours_off)
    load_refused(folder, str(folder), "rank-0.pt.trace.json.gz and rank-1.pt.trace.json.gz were recorded",
             "s apart: they are from different runs")


def test_kineto_rank_not_below_its_world_size(tmp_path):
    """Rank 5 of world_size 2 made the job 6 ranks, refused as "the traces disagree on the world size (...: 6)"."""
    folder, name = _dlrm_edited(tmp_path, 5, rank=9)
    load_refused(folder, name, "rank 9 (from the distributedInfo) but distributedInfo says world_size 8")


# ---------------------------------------------------------------- item 2: a rank twice

def test_two_kineto_files_claim_the_same_rank(tmp_path):
    folder, _ = _dlrm_edited(tmp_path, 6, rank=2)  # rank 6's trace now says it is rank 2; rank 6 itself is gone
    load_refused(folder, "rank 2 appears twice")


def test_run_folder_whose_rank1_is_a_copy_of_rank0(tmp_path, capsys):
    run = copy_fixture(tmp_path, "run_schema/v1")
    shutil.copy(run / "rank0.json", run / "rank1.json")
    load_refused(run, str(run / "rank1.json"), "holds rank 0, not rank 1", "a copy of rank0.json")
    code, _, err = _cli(capsys, "replay", run, "--allow-missing-ranks")  # no opt-in for a wrong file
    assert code == 2 and "holds rank 0, not rank 1" in err


def test_run_folder_copy_with_its_rank_edited(tmp_path):
    run = copy_fixture(tmp_path, "run_schema/v1")
    doc = json.loads((run / "rank0.json").read_text())
    doc["rank"] = 1
    (run / "rank1.json").write_text(json.dumps(doc))
    load_refused(run, "rank0.json and rank1.json were written by the same process", "one is a copy")


def test_run_folder_rank_file_of_another_world_size(tmp_path):
    run = copy_fixture(tmp_path, "run_schema/v1")
    edit_json(run / "rank1.json", lambda doc: doc.update(world_size=4))
    load_refused(run, "rank 1 of a 4-rank job, but manifest.json says 2 ranks")


def test_run_folder_missing_a_rank_file(tmp_path, capsys):
    run = copy_fixture(tmp_path, "run_schema/v1")
    os.remove(run / "rank1.json")
    load_refused(run, str(run), "rank 1 of 2: nothing written (no rank1.json, no completed step)", "--allow-missing-ranks")
    code, out, _ = _cli(capsys, "analyze", run, "--allow-missing-ranks", "--json")
    r = json.loads(out)
    assert code == 0 and r["partial"] is True and any("1 of 2 ranks missing" in w for w in r["warnings"])


def test_the_rank_left_of_a_partial_run_replays_as_measured(tmp_path, capsys):
    """A collective no peer recorded was timed from its issue: DDP's buckets queued behind each other on the channel counted
    that wait twice, and rank 0 of the testbed run without its rank 1 replayed at 800 ms against 206 measured (+289 %)."""
    run = copy_fixture(tmp_path, "ddp-testbed/run")
    os.remove(run / "rank1.json")
    code, out, _ = _cli(capsys, "replay", run, "--allow-missing-ranks", "--json", "-o", tmp_path / "out")
    r = json.loads(out)
    assert code == 0 and r["partial"] is True and abs(r["error_pct"]) < 1, r["error_pct"]


@pytest.mark.parametrize("target,why", [("rank1.json", "Too many levels of symbolic links"), ("gone.json", "file is missing")])
def test_run_folder_rank_file_a_broken_link(tmp_path, capsys, target, why):
    """A link loop or a dangling link was "nothing written (no rank1.json ...)" beside a rank1.json in ``ls``."""
    run = copy_fixture(tmp_path, "run_schema/v1")
    os.remove(run / "rank1.json")
    os.symlink(target, run / "rank1.json")
    load_refused(run, str(run / "rank1.json"), why)


@pytest.mark.parametrize("t_ns", [-5, 2**62])
def test_run_folder_hook_record_with_a_damaged_time_is_counted(tmp_path, t_ns):
    """A record timed outside every step was left out of the replay with no word."""
    run = copy_fixture(tmp_path, "run_schema/v1")
    doc = json.loads((run / "rank1.json").read_text())
    k = next(i for i, r in enumerate(doc["records"]) if r[0] == rs.Rec.FWD_END)
    doc["records"][k][3] = t_ns
    (run / "rank1.json").write_text(json.dumps(doc))
    warned = [w.what for w in load(run).meta.warnings if "hook records" in w.what]
    assert warned == [f"rank1.json: 1 of {len(doc['records'])} hook records are timed more than a step outside the profiled steps "
                      "(damaged file?): left out"]


def test_tf_jax_rank_file_copy(tmp_path):
    run = tmp_path / "tf"
    shutil.copytree(DATA / "tf-jax" / "mlp", run)
    shutil.copy(run / "rank0.json", run / "rank1.json")
    load_refused(run, "holds rank 0 of 2, not rank 1 of 2")


def test_tf_jax_run_folder_missing_a_rank(tmp_path):
    run = tmp_path / "tf"
    shutil.copytree(DATA / "tf-jax" / "mlp", run)
    os.remove(run / "rank1.json")
    load_refused(run, "rank 1 of 2: no rank1.json", "--allow-missing-ranks")
    assert [t.rank for t in load(run, allow_missing_ranks=True).ranks] == [0]


def test_horovod_rank_file_copy(tmp_path):
    run = tmp_path / "hvd"
    shutil.copytree(DATA / "horovod" / "fused", run)
    shutil.copy(run / "rank0.horovod.json", run / "rank1.horovod.json")
    load_refused(run, "rank1.horovod.json", "holds rank 0, not rank 1")


@pytest.mark.parametrize("damage,needles", [
    # cut inside its first response: every gradient was replayed without its all-reduce (comm 0 ms, exit 0)
    (lambda run: (run / "horovod_timeline.json").write_bytes((DATA / "horovod" / "fused" / "horovod_timeline.json").read_bytes()[:3000]),
     ("horovod_timeline.json", "none of the 60 gradient requests of rank 0 in the profiled steps has a response")),
    # the unfused run's timeline, recorded 19 s later: matched by tensor name, then "graph has a dependency cycle"
    (lambda run: shutil.copy(DATA / "horovod" / "unfused" / "horovod_timeline.json", run),
     ("horovod_timeline.json", "its responses are 19 s after the profiled steps of rank0.json: it is another run's timeline")),
    # the unfused run's rank 1 on the same host 19 s later: replayed as one job (ranks 55 and 36 ms, exit 0)
    (lambda run: shutil.copy(DATA / "horovod" / "unfused" / "rank1.json", run),
     ("rank0.json and rank1.json were recorded 19 s apart: they are from different runs",)),
])
def test_horovod_run_with_another_runs_or_a_cut_file(tmp_path, damage, needles):
    run = tmp_path / "hvd"
    shutil.copytree(DATA / "horovod" / "fused", run)
    damage(run)
    load_refused(run, str(run), *needles)


def _fsdp_record_index(run):
    def damage(doc):
        next(r for r in doc["records"] if r[0] == rs.Rec.FSDP_COLL_BEGIN)[1] = 9999

    edit_json(run / "rank1.json", damage)


@pytest.mark.parametrize("name,damage,needles", [
    # the collective lost its begin unseen, then "mismatched collectives: collective #0 (allgather) ... missing on rank(s) [1]"
    ("reshard", _fsdp_record_index, ("rank1.json: 1 FSDP record(s) name collective 9999, but the file lists 18 collectives",)),
    # keep4's rank 1 beside reshard4's rank 0, on one host 23 s later: within the 30 s allowed across hosts
    ("reshard4", lambda run: shutil.copy(DATA / "fsdp" / "keep4" / "rank1.json", run),
     ("rank0.json and rank1.json were recorded 23 s apart: they are from different runs",)),
])
def test_fsdp_run_with_a_damaged_or_foreign_rank_file(tmp_path, name, damage, needles):
    run = tmp_path / name
    shutil.copytree(DATA / "fsdp" / name, run)
    damage(run)
    load_refused(run, *needles)


def test_mxnet_worker_trace_of_another_run(tmp_path):
    """Another recording's worker trace failed as "worker 1 step 4 has no push/pull"."""
    run = tmp_path / "mx"
    shutil.copytree(DATA / "mxnet", run, ignore=shutil.ignore_patterns("testbed", "user_mlp"))
    shutil.copy(DATA / "mxnet" / "testbed" / "s1_500M" / "worker1.json.gz", run)
    load_refused(run, str(run / "worker1.json.gz"), "s from worker 1's profiled steps in mxnet-run.json: another run's trace")


# ---------------------------------------------------------------- item 13: recorded runs with a killed rank (fast)

KILLED = DATA / "killed-rank"


@pytest.mark.parametrize("name, why", [
    ("sigterm", "rank 1 of 2: stopped by SIGTERM during step 3, no rank1.json: steps 3-4 missing"),
    ("sigkill", "rank 1 of 2: killed (SIGKILL, out of memory), crashed or still running: its step files end at step 2, "
                "no rank1.json: steps 3-4 missing"),
])
def test_recorded_killed_runs(name, why, tmp_path, capsys):
    """Real 2-rank torchrun jobs (tests/data/killed-rank): rank 1 stopped at step 3 of the window 1-4; rank 0 then
    failed in its next all-reduce and wrote its own file, saying so."""
    text = load_refused(KILLED / name, why, "rank 0 of 2: ended by RuntimeError (", "during step 3: steps 3-4 missing", "--allow-missing-ranks")
    assert text.startswith(f"{KILLED / name}: incomplete profile: ")
    run = load(KILLED / name, allow_missing_ranks=True)
    assert [t.meta.steps_profiled for t in run.ranks] == [[1, 2], [1, 2]] and run.meta.partial
    code, out, _ = _cli(capsys, "analyze", KILLED / name, "--allow-missing-ranks", "--json")
    r = json.loads(out)
    assert code == 0 and r["partial"] and [p["rank"] for p in r["per_rank"]] == [0, 1]


def test_step_log_lines_are_versioned_and_checked(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(KILLED / "sigkill", run)
    log = run / "rank1.steps" / "steps.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(lines[0] + lines[1].replace(b'"version":1', b'"version":99'))
    load_refused(run, "steps.jsonl line 2: written by a newer dagprof (format version 99")
    log.write_bytes(lines[0] + b"{not json\n")
    load_refused(run, "steps.jsonl line 2: corrupt or truncated")
    log.write_bytes(lines[0] + lines[1].replace(b'"rank":1', b'"rank":0'))
    load_refused(run, "holds a step of rank 0, not of rank 1")


# ---------------------------------------------------------------- item 13: a rank killed mid-window, for real

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, *job_args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", str(_free_port()),
            str(TESTS / "killed_rank_job.py"), *job_args]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)]), "OMP_NUM_THREADS": "1"}


def _killed_run(out: pathlib.Path, nproc: int, sig: str, *extra: str) -> subprocess.CompletedProcess:
    """A real torchrun job, profiled with dagprof.profile over steps 2-7, whose rank ``nproc - 1`` gets ``sig`` at step 5."""
    cmd = _torchrun(nproc, "--profile", str(out), "--profile-steps", "2:8", "--die-rank", str(nproc - 1), "--die-step", "5",
                    "--die-signal", sig, *extra)
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode != 0, done.stderr[-2000:]
    return done


def _check_partial(run_dir: pathlib.Path, capsys, world: int, killed_why: str) -> dict:
    """Refused naming the killed rank and steps 5-7; with the opt-in every rank's steps 2-4 replay."""
    code, out, err = _cli(capsys, "replay", run_dir, "-o", run_dir / "out")
    assert code == 2 and not out and err.count("\n") == 1, err
    assert f"rank {world - 1} of {world}: {killed_why}" in err and "steps 5-7 missing" in err, err
    for r in range(world - 1):  # the survivors: torchrun stopped them, or the dead peer broke their collective
        assert f"{r} of {world}" in err or f"{r}-" in err or f", {r}" in err or f" {r}," in err, err
    code, out, _ = _cli(capsys, "replay", run_dir, "-o", run_dir / "out", "--allow-missing-ranks", "--json")
    r = json.loads(out)
    assert code == 0 and r["partial"] is True and r["steps"] == [2, 3, 4]
    assert sorted(row["rank"] for row in r["per_rank"]) == list(range(world))
    assert any("partial analysis" in w and f"rank {world - 1}" in w for w in r["warnings"])
    return r


@pytest.mark.parametrize("kineto", [False, True], ids=["hooks", "kineto"])
def test_sigkill_one_of_two_ranks(tmp_path, capsys, kineto):
    out = tmp_path / "run"
    _killed_run(out, 2, "KILL", *(["--kineto"] if kineto else []))
    assert not (out / "rank1.json").exists()
    assert sorted(os.listdir(out / "rank1.steps")) == ["head.json", "steps.jsonl"]
    parts, torn = rs.read_step_log(out / "rank1.steps" / "steps.jsonl")
    assert [p.step for p in parts] == [2, 3, 4] and not torn
    run = load(out, allow_missing_ranks=True)
    assert [t.meta.steps_profiled for t in run.ranks] == [[2, 3, 4], [2, 3, 4]]
    _check_partial(out, capsys, 2, "killed (SIGKILL, out of memory), crashed or still running: its step files end at step 4, no rank1.json")
    # killed while appending step 5: the line has no newline (no commit), so it is dropped with a warning
    log = out / "rank1.steps" / "steps.jsonl"
    whole = log.read_bytes()
    log.write_bytes(whole + whole.splitlines(keepends=True)[-1][:100].replace(b'"step":4', b'"step":5'))
    run = load(out, allow_missing_ranks=True)
    assert run.rank(1).meta.steps_profiled == [2, 3, 4]
    assert any("the record of the step after 4 was cut off" in str(w) for w in run.meta.warnings)


def test_sigterm_one_of_three_ranks(tmp_path, capsys):
    out = tmp_path / "run"
    _killed_run(out, 3, "TERM")
    ended = rs.read_file(out / "rank2.steps" / "ended.json", rs.Ended)
    assert ended.rank == 2 and ended.how == "stopped by SIGTERM during step 5"
    _check_partial(out, capsys, 3, "stopped by SIGTERM during step 5, no rank2.json")


def test_sigint_one_of_two_ranks_unwinds_and_writes_its_file(tmp_path, capsys):
    """SIGINT keeps Python's behaviour (KeyboardInterrupt): the rank's own file is written, saying why it is short."""
    out = tmp_path / "run"
    _killed_run(out, 2, "INT")
    doc = rs.read_file(out / "rank1.json", rs.RankFile)
    assert doc.ended == "stopped by SIGINT during step 5" and doc.steps_profiled == [2, 3, 4]
    assert not (out / "rank1.steps").exists()
    _check_partial(out, capsys, 2, "stopped by SIGINT during step 5: steps 5-7 missing")


def test_zero_code_launcher_sigkill_one_of_three(tmp_path, capsys):
    out = tmp_path / "run"
    cmd = _torchrun(3, "--die-rank", "1", "--die-step", "5", "--die-signal", "KILL")
    env = _env()
    old = os.environ.copy()
    os.environ.update(PYTHONPATH=env["PYTHONPATH"], OMP_NUM_THREADS="1")
    try:
        code, _, err = _cli(capsys, "profile", "-o", out, "--steps", "2:8", "--no-kineto", "--", *cmd)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert code == 2 and "the profiled command exited with status 1" in err
    assert "rank 1 of 3: killed (SIGKILL, out of memory), crashed or still running: its step files end at step 4" in err
    assert "steps 5-7 missing" in err and "--allow-missing-ranks" in err
    run = load(out, allow_missing_ranks=True)
    assert [t.meta.steps_profiled for t in run.ranks] == [[2, 3, 4]] * 3


def test_completed_run_leaves_no_step_files(small_ddp_run):
    """A run that ends normally holds rank<R>.json only: the step files are gone once it is written."""
    assert not glob.glob(os.path.join(small_ddp_run, "rank*.steps"))
    run = load(small_ddp_run)
    assert not run.meta.rank_gaps and not run.meta.partial


_HANDLER_JOB = """
import os, signal, sys, torch, dagprof
seen = []
signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))  # the program's own handler: it carries on
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), 0.1)
with dagprof.profile(sys.argv[1], steps="1:4", model=model, kineto=False) as prof:
    for step in range(6):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        model(torch.ones(4, 8)).sum().backward(); opt.step(); opt.zero_grad(); prof.step()
assert seen == [signal.SIGTERM], seen
assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # the program's handler is back
print("trained to the end")
"""


def test_signal_chains_to_the_programs_handler(tmp_path):
    """dagprof notes the signal, then the program's own handler runs; training goes on and the profile is whole."""
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", _HANDLER_JOB, str(out)], env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "trained to the end" in done.stdout, done.stderr[-2000:]
    run = load(out)
    assert run.ranks[0].meta.steps_profiled == [1, 2, 3] and not run.meta.rank_gaps
    assert rs.read_file(out / "rank0.json", rs.RankFile).ended == ""  # it carried on: nothing stopped it


def test_profile_removes_an_earlier_runs_step_logs(tmp_path, capsys):
    """A stale rank<R>.steps/ from an earlier profile in the same folder must not pass for this run's rank."""
    shutil.copytree(KILLED / "sigkill", tmp_path / "run")
    mine = tmp_path / "run" / "rank7.steps"  # a user's folder that is not a step log: left alone
    mine.mkdir()
    code, _, err = _cli(capsys, "profile", "-o", tmp_path / "run", "--", sys.executable, "-c", "pass")
    assert code == 2 and "no rank wrote a profile" in err
    assert sorted(os.listdir(tmp_path / "run")) == ["rank7.steps"]


def test_kineto_folder_says_which_json_files_it_skipped(tmp_path):
    """Other JSON files beside the traces (a rank's trace saved as something else too) were skipped without a word."""
    folder = tmp_path / "gloo"
    shutil.copytree(GLOO / "same", folder)
    shutil.copy(DATA / "fsdp" / "testbed-calibrate" / "1gbit.json", folder / "link.json")
    assert [w.what for w in load(folder).meta.warnings] == [
        "1 JSON file(s) here are not Kineto traces, skipped: link.json (not a Kineto trace: no 'traceEvents' list)"]
