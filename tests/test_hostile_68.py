"""Stop 68's damaged inputs: a layer CSV's measured iteration said (used, compared or refused, never dropped without a
word), and a ``dagprof profile`` stopped by a signal leaving no empty folder, or one every reader refuses as incomplete."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dagprof.cli.main import main
from dagprof.traces.profiling_mark import INCOMPLETE

LAYERS = """# io_us=500, h2d_us=100, update_us=300, iter_us={iter_us}{workers}
layer,forward_us,backward_us,grad_bytes,allreduce_us
conv1,1200,2400,37632,300
conv2,3000,6000,1180000,2000
fc,500,1000,4100000,5000
"""


def _sgd(tmp_path: Path, capsys, iter_us: float, workers: str, *flags: str) -> tuple[int, dict | str]:
    path = tmp_path / "layers.csv"
    path.write_text(LAYERS.format(iter_us=iter_us, workers=workers))
    rc = main(["sgd", "--json", str(path), *flags])
    out, err = capsys.readouterr()
    return rc, json.loads(out) if rc == 0 else err


def test_iter_us_beyond_one_worker_is_compared_with_the_model(tmp_path, capsys):
    """20 ms measured on 4 workers where the layers model 14.7 ms: said with the gap, and which one the rows are
    (read as nothing on the old src)."""
    rc, r = _sgd(tmp_path, capsys, 20000, ", workers=4", "--workers", "1,4")
    assert rc == 0
    row = next(x for x in r["rows"] if x["workers"] == 4)
    said = [n for n in r["notes"] if "iter_us 20.00 ms measured on 4 workers" in n]
    assert len(said) == 1 and f"{row['iter_time_s'] * 1e3:.2f} ms there (-26.5 %)" in said[0] and "the rows are the layer times'" in said[0]


def test_iter_us_near_the_model_goes_unsaid_and_a_row_missing_is_said(tmp_path, capsys):
    rc, r = _sgd(tmp_path, capsys, 14700, ", workers=4", "--workers", "1,4")
    assert rc == 0 and not any("iter_us" in n for n in r["notes"])
    rc, r = _sgd(tmp_path, capsys, 20000, ", workers=4", "--workers", "1,2")
    assert rc == 0 and any("not compared: 4 is not among --workers" in n for n in r["notes"])


def test_iter_us_without_workers_is_refused_naming_the_file(tmp_path, capsys):
    rc, err = _sgd(tmp_path, capsys, 20000, "")
    assert rc == 2 and "layers.csv: iter_us= needs workers=" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("iter_us, workers, said", [(0, ", workers=4", "iter_us=0"), (0, ", workers=1", "iter_us=0"),
                                                     (20000, ", workers=0", "workers=0")])
def test_no_time_or_no_workers_is_refused_naming_the_file(tmp_path, capsys, iter_us, workers, said):
    """An iteration of 0 us on 4 workers was an internal error (the gap divided by it), on 1 worker a refusal naming no
    file; 0 workers read as a count."""
    rc, err = _sgd(tmp_path, capsys, iter_us, workers, "--workers", "1,4", "--net", "10gbe")
    assert rc == 2 and f"layers.csv: {said}: a measured " in err and len(err.strip().splitlines()) == 1


def test_iter_us_on_one_worker_overridden_by_the_flag_is_said(tmp_path, capsys):
    rc, r = _sgd(tmp_path, capsys, 20000, ", workers=1", "--workers", "1,4", "--iter-time-1", "0.018", "--net", "10gbe")
    assert rc == 0 and r["iter_time_1_s"] == pytest.approx(0.018)
    assert any("iter_us 20.00 ms measured on 1 worker not used: --iter-time-1 18.00 ms" in n for n in r["notes"])
    rc, r = _sgd(tmp_path, capsys, 20000, ", workers=1", "--workers", "1,4", "--net", "10gbe")
    assert rc == 0 and r["iter_time_1_s"] == pytest.approx(0.02) and not any("iter_us" in n for n in r["notes"])


# ---------------------------------------------------------------- a profile stopped by a signal

def _job_processes(out: Path) -> list[int]:
    """The processes still running with ``out`` as their profile folder (the job's launcher and ranks)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and f"DAGPROF_OUT={out}".encode() in (d / "environ").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def _profile_stopped(out: Path, steps: str, ready, sig: int = signal.SIGTERM) -> tuple[int, str]:
    """``dagprof profile`` of the demo's 2-rank job, stopped by ``sig`` once ``ready(out)``; its exit status and output."""
    job = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "dagprof.collect.jobs.demo_train",
           "--small", "--steps", "2000"]
    p = subprocess.Popen([sys.executable, "-m", "dagprof", "profile", "-o", str(out), "--no-kineto", "--steps", steps, "--", *job],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not ready(out) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, p.communicate()[0]
    os.killpg(p.pid, sig) if sig == signal.SIGKILL else p.send_signal(sig)
    text = p.communicate(timeout=120)[0]
    return p.returncode, text


def test_profile_stopped_before_anything_was_written_leaves_no_folder(tmp_path):
    out = tmp_path / "run"
    rc, text = _profile_stopped(out, "2:4", lambda o: (o / INCOMPLETE).exists())
    assert rc == 130 and "dagprof profile: interrupted" in text
    assert not out.exists() and not _job_processes(out)  # on the old src: an empty folder


def test_profile_stopped_inside_its_window_is_refused_as_incomplete(tmp_path, capsys):
    """The ranks' own records say which steps the stop cut (the mark is tidied away: it would hide them)."""
    out = tmp_path / "run"
    rc, _ = _profile_stopped(out, "2:1900", lambda o: (o / "manifest.json").exists(), signal.SIGINT)
    assert rc == 130 and not (out / INCOMPLETE).exists() and not _job_processes(out)
    assert main(["analyze", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{out}: incomplete profile: rank " in err and "--allow-missing-ranks" in err, err


def test_profile_killed_before_its_window_is_refused_as_incomplete(tmp_path, capsys):
    """SIGKILL to the whole job (``timeout -s KILL``, the out-of-memory killer): nothing can tidy, the mark stays, and
    every reader refuses the folder in one line (on the old src: an empty folder read as "no torch.profiler traces")."""
    out = tmp_path / "run"
    rc, _ = _profile_stopped(out, "2:4", lambda o: (o / INCOMPLETE).exists(), signal.SIGKILL)
    assert rc == -signal.SIGKILL and os.listdir(out) == [INCOMPLETE]
    for argv in (["analyze", str(out)], ["sgd", str(out)], ["whatif", str(out), "--bandwidth", "1Gbit", "--no-trace"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{out}: incomplete profile: the dagprof profile started " in err, err


def test_profile_stopped_after_its_window_keeps_the_profile(tmp_path, capsys):
    out = tmp_path / "run"
    rc, _ = _profile_stopped(out, "2:4", lambda o: all((o / f"rank{r}.json").exists() for r in (0, 1)))
    assert rc == 130 and not (out / INCOMPLETE).exists()
    assert main(["analyze", "--json", str(out)]) == 0
    assert len(json.loads(capsys.readouterr().out)["per_rank"]) == 2


def test_a_damaged_mark_refuses_alike(tmp_path, capsys):
    (tmp_path / INCOMPLETE).write_bytes(b"\x00garbage")
    assert main(["analyze", str(tmp_path)]) == 2
    assert "incomplete profile: the dagprof profile started at an unknown time" in capsys.readouterr().err


def test_a_new_profile_replaces_a_stopped_ones_mark(tmp_path, capsys):
    (tmp_path / INCOMPLETE).write_text("{}")
    assert main(["profile", "-o", str(tmp_path), "--", sys.executable, "-c", "pass"]) == 2
    assert "no rank wrote a profile" in capsys.readouterr().err and not (tmp_path / INCOMPLETE).exists()
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- bench/damage_67.py's sweep, finished

DATA = Path(__file__).parent / "data"


def test_a_profiled_bandwidth_its_collectives_outran_is_refused_without_a_per_byte_fit(capsys):
    """The HSDP transformer's 17.7 MB a step moved at least 12.7x a 10 Mbit/s wire; its fit shows no time per byte, so
    the fit's own check never ran and a 1 Gbit/s what-if was answered with exit 0."""
    argv = ["whatif", str(DATA / "fsdp/hsdp-tf"), "--profiled-bandwidth", "10Mbit", "--bandwidth", "1Gbit", "--no-trace"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--profiled-bandwidth 10Mbit: the 127 collectives (17.7 MB) moved their bytes at least 12.7 times that rate" in err


def test_an_empty_step_marker_and_a_missing_command_are_said(tmp_path, capsys):
    assert main(["analyze", str(DATA / "ddp-fresh/gat-log-1g"), "--step-marker", ""]) == 2  # was read as none, exit 0
    assert "argument --step-marker: an annotation's name is needed" in capsys.readouterr().err
    assert main(["profile", "-o", str(tmp_path / "p")]) == 2
    assert f"{tmp_path / 'p'}: no command to profile" in capsys.readouterr().err and not (tmp_path / "p").exists()


def test_input_dims_nested_past_numpys_dimensions_read_as_unrecorded():
    """A damaged collective's ``Input Dims`` nesting lists past numpy's 64 dimensions (ci68's fuzzing drew one) read as
    no tensor's dims, as other malformed shapes are, not a ValueError from ``np.prod``."""
    from dagprof.traces.kineto_schema import _dims_elems

    deep: list = [1]
    for _ in range(70):
        deep = [deep]
    assert _dims_elems([[deep]]) == 0
    assert _dims_elems([[[2, 3], [4]]]) == 10 and _dims_elems([[2, 3]]) == 6
