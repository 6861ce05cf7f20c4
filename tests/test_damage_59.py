"""A user's real mistakes and real corruption (``bench/damage_59.py`` sweeps them over every reader), one check per fix.

Each was answered before with exit 0 and a wrong number, or a window other than asked with no word. Every copy is made
in the test from a vendored fixture; nothing under tests/data changes.
"""
from __future__ import annotations

from testdata import DATA, cli_json, copy_fixture, edit_json


def _middle_step_marker(doc: dict, dur: float) -> None:
    steps = sorted((e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    steps[len(steps) // 2]["dur"] = dur


def test_a_step_one_rank_lost_is_left_out_not_chained_across(tmp_path, capsys):
    """Rank 1's middle step marker read 1e12 us: skipped as corrupt (said), its step then missing on rank 1 alone, and the
    window 2, 4 replayed rank 1's steps 2 and 4 back to back: 24.5 ms for a run of 16.3, predicted 70 % over measured.
    The window is one stretch of steps every rank holds now, and the line says which step which rank lacks."""
    run = copy_fixture(tmp_path, "gloo-windows/same")
    edit_json(run / "rank-1.pt.trace.json.gz", lambda d: _middle_step_marker(d, 1e12))
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(run))
    assert rc == 0, err
    steps = doc["steps"]
    assert steps == list(range(steps[0], steps[0] + len(steps))) and 3 not in steps, steps
    assert any("rank 1 lacks step 3" in w for w in doc["warnings"]), doc["warnings"]
    assert abs(doc["predicted_iter_ms"] - doc["measured_iter_ms"]) <= 0.05 * doc["measured_iter_ms"]


def test_steps_asked_past_the_trace_say_which_were_used(tmp_path, capsys):
    """``--steps 0:100000`` on a run of steps 5..12 answered over 5..12 with no word; it says so now (one beyond every
    step is refused, as before)."""
    run = copy_fixture(tmp_path, "ddp-testbed/run")
    rc, doc, err = cli_json(capsys, "analyze", "--json", "--steps", "0:100000", str(run))
    assert rc == 0, err
    assert doc["steps"] == list(range(5, 13))
    assert any("steps 0..99999 requested" in w and "5..12" in w for w in doc["warnings"]), doc["warnings"]
    rc, doc, err = cli_json(capsys, "analyze", "--json", "--steps", "6:9", str(run))
    assert rc == 0 and not any("requested" in w for w in doc["warnings"]), doc["warnings"]


def test_link_from_of_another_link_is_refused(tmp_path, capsys):
    """``--link-from`` an unshaped link's calibration for a run profiled at 1 Gbit/s: ``--link-to`` the 1 Gbit/s file
    answered 427.7 ms for a run that measured 205.7 ms on that very link, with no word. Refused in one line naming the
    file; the profiled link's own file still answers."""
    run = copy_fixture(tmp_path, "ddp-testbed/run")
    wrong, right = DATA / "ddp-testbed/unshaped-overlap.json", DATA / "ddp-testbed/1gbit-overlap.json"
    rc, doc, err = cli_json(capsys, "whatif", "--json", str(run), "--link-from", str(wrong), "--link-to", str(right), "--no-trace")
    assert rc == 2
    line = err.strip().splitlines()[-1]
    assert str(wrong) in line and "not the link this run was profiled on" in line and len(err.strip().splitlines()) == 1
    rc, doc, err = cli_json(capsys, "whatif", "--json", str(run), "--link-from", str(right), "--link-to", str(wrong), "--no-trace")
    assert rc == 0, err


def test_an_archive_of_a_run_is_named_as_one(tmp_path, capsys):
    """A tar.gz of a run folder was refused as "one rank file of a dagprof run folder" (its first member's bytes), a zip
    as corrupt JSON: both are named as archives now, with what to do."""
    import tarfile  # noqa: PLC0415
    import zipfile  # noqa: PLC0415

    run = copy_fixture(tmp_path, "ddp-testbed/run")
    with tarfile.open(tmp_path / "run.tar.gz", "w:gz") as tar:
        tar.add(run, arcname="run")
    with zipfile.ZipFile(tmp_path / "run.zip", "w") as z:
        for p in sorted(run.iterdir()):
            z.write(p, f"run/{p.name}")
    for name in ("run.tar.gz", "run.zip"):
        rc, _, err = cli_json(capsys, "analyze", "--json", str(tmp_path / name))
        assert rc == 2
        assert err.count("\n") == 1 and str(tmp_path / name) in err and "an archive" in err and "unpack it" in err, err


def test_a_folder_of_runs_names_them(tmp_path, capsys):
    """The folder above two runs was "no torch.profiler traces here"; the line names the runs it holds now."""
    (tmp_path / "runs").mkdir()
    for name in ("b-run", "a-run"):
        copy_fixture(tmp_path, "ddp-testbed/run").rename(tmp_path / "runs" / name)
    (tmp_path / "runs" / "notes").mkdir()
    rc, _, err = cli_json(capsys, "analyze", "--json", str(tmp_path / "runs"))
    assert rc == 2 and "2 of its folders hold runs (a-run, b-run): give dagprof one of them" in err, err


def test_sgd_says_when_net_is_not_what_priced_a_row(capsys):
    """B-Caffe's tmp4comm.log measured its all-reduces at 4 workers; ``--net 100Mbit --workers 4`` answered those
    measured (10GbE) times, the same 0.262 s as ``--net 800Gbit``, with no word that --net went unused."""
    log = str(DATA / "bcaffe-k80-googlenet/tmp4comm.log")
    rc, doc, err = cli_json(capsys, "sgd", "--json", log, "--workers", "4", "--net", "100Mbit")
    assert rc == 0, err
    assert any("--net 100Mbit unused on 1 worker count (4)" in n for n in doc["notes"]), doc["notes"]
    rc, doc, err = cli_json(capsys, "sgd", "--json", log, "--workers", "2", "--net", "100Mbit")
    assert rc == 0 and not any("unused" in n for n in doc["notes"]), doc["notes"]
