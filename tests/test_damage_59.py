"""A user's real mistakes and real corruption (``bench/damage_59.py`` sweeps them over every reader), one check per fix.

Each was answered before with exit 0 and a wrong number, or a window other than asked with no word. Every copy is made
in the test from a vendored fixture; nothing under tests/data changes.
"""
from __future__ import annotations

import json

from testdata import DATA, cli_json, copy_fixture, edit_json, folded_lines

from dagprof.cli.main import main


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


def test_a_wrong_file_for_a_file_flag_says_what_it_is(tmp_path, capsys):
    """A Kineto trace or a strategy given to ``sgd --comm-log`` read "line N, the last, has no end of line: the file was
    cut short", to ``--osu`` "line 1: expected 'SIZE LATENCY_US'", a strategy to ``--link-model`` "link needs alpha_us";
    a layer log ending in NUL bytes (a crash) read "cut short": each says what the file is now."""
    log, kineto, strategy = (str(DATA / p) for p in ("bcaffe-k80-googlenet/tmp4comm.log", "gloo-windows/same/rank-0.pt.trace.json.gz",
                                                     "strategy/v1.json"))
    for flag, path, said in (("--comm-log", kineto, "not a layer file (a B-Caffe log or a layer CSV): it looks like a torch.profiler"),
                             ("--comm-log", strategy, "it looks like a dagprof strategy file"),
                             ("--osu", kineto, "not an OSU all-reduce latency table: it looks like a torch.profiler"),
                             ("--link-model", strategy, "not a dagprof calibrate link model: it looks like a dagprof strategy file")):
        rc, _, err = cli_json(capsys, "sgd", "--json", log, "--workers", "4", flag, path)
        assert rc == 2 and path in err and said in err and err.count("\n") == 1, (flag, err)
    nul = tmp_path / "tmp4comm.log"
    nul.write_bytes((DATA / "bcaffe-k80-googlenet/tmp4comm.log").read_bytes() + bytes(4096))
    rc, _, err = cli_json(capsys, "sgd", "--json", str(nul), "--workers", "4")
    assert rc == 2 and "4096 NUL bytes" in err and "cut short" not in err, err


def test_dagprof_own_outputs_given_as_input_are_named(tmp_path, capsys):
    """``analyze --json``'s answer saved to a file, and the replay's Perfetto timeline, given back as the input: "not a
    Kineto trace: no 'traceEvents' list" and "no schemaVersion, distributedInfo or deviceProperties"; named now."""
    run = copy_fixture(tmp_path, "ddp-testbed/run")
    rc, _, err = cli_json(capsys, "replay", str(run), "-o", str(tmp_path / "out"))
    assert rc == 0, err
    answer = tmp_path / "analyze.json"
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(run))
    answer.write_text(json.dumps(doc))
    for path, said in ((answer, "a dagprof --json answer"), (tmp_path / "out/replay.trace.json", "a timeline dagprof wrote"),
                       (tmp_path / "out/measured.trace.json", "a timeline dagprof wrote")):
        rc, _, err = cli_json(capsys, "analyze", "--json", str(path))
        assert rc == 2 and str(path) in err and said in err and err.count("\n") == 1, err


def test_a_bad_topology_file_is_read_where_no_link_is_fitted(capsys):
    """A trace with no collective to fit a link to (one rank) swallowed the error of the --topology file it was given
    (a strategy): the what-if answered as measured with no word. The file is read, and refused, all the same."""
    trace = str(DATA / "kineto-public/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    strategy = str(DATA / "strategy/v1.json")
    rc, _, err = cli_json(capsys, "whatif", "--json", trace, "--topology", strategy, "--no-trace")
    assert rc == 2 and strategy in err and "bad topology" in err, err


def test_a_good_topology_is_said_unused_where_no_link_is_fitted(capsys):
    """A valid --topology given for a 1-rank trace (no data-parallel collective to price on it) was read and then left
    unused with no word, so the table read as an answer on that cluster: one note says so, in --json and in the text."""
    trace = str(DATA / "kineto-public/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    rc, doc, err = cli_json(capsys, "whatif", "--json", trace, "--topology", "10gbe", "--no-trace")
    assert rc == 0, err
    said = [n for n in doc["notes"] if n.startswith("--topology 10gbe read but unused")]
    assert len(said) == 1 and "no data-parallel collective" in said[0], doc["notes"]
    rc, doc, err = cli_json(capsys, "whatif", "--json", trace, "--no-trace")
    assert rc == 0 and not any("read but unused" in n for n in doc["notes"]), err
    assert main(["whatif", trace, "--topology", "10gbe", "--no-trace"]) == 0  # the text: the note as its own line
    assert " ".join(f"note: {said[0]}".split()) in folded_lines(capsys.readouterr().out, "note: ")


def test_link_from_whose_sweep_is_ranks_waiting_for_cores_says_so_in_numbers(tmp_path, capsys):
    """A calibration of the profiled link taken as the testbed's loopback is (4 ranks over 2 CPUs): its 4-256 KiB all-reduces
    read 5-8 ms whatever their bytes, so its fit prices the run's buckets many times over the run's own. The one line says
    what its sweep read (medians, quietest repetitions, the ranks' spread, ranks over CPUs at the load) and what to do."""
    run = copy_fixture(tmp_path, "ddp-testbed/run")
    sizes = [4096, 16384, 65536, 262144, 1048576, 4194304]
    medians = [6950.0, 5070.0, 7940.0, 6770.0, 100e3, 400e3]
    times = [[[t, t * 0.6], [t - 300.0, t * 0.6 - 200.0]] for t in medians]  # 2 ranks x 2 repetitions
    doc = {"alpha_us": 5000.0, "beta_us_per_byte": 0.05, "workers": 2, "version": 5, "backend": "gloo", "cpus": 2, "load": [3.6, 3.7],
           "points": [[m, t] for m, t in zip(sizes, medians)], "times_us": times, "kinds": {}}
    slow = tmp_path / "scheduled.json"
    slow.write_text(json.dumps(doc))
    rc, _, err = cli_json(capsys, "whatif", "--json", str(run), "--link-from", str(slow), "--link-to", str(DATA / "ddp-testbed/1gbit-overlap.json"),
                          "--no-trace")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    line = err.strip()
    assert str(slow) in line and "not the link this run was profiled on" in line
    assert "all-reduces of 4 KiB-256 KiB took 5.07-7.94 ms (medians) whatever their bytes" in line
    assert "3.04-4.76 in their quietest repetition, the ranks getting out 0.25-0.25 ms apart; 2 ranks on 2 CPUs at load 3.7" in line
    assert "ranks waiting for a core" in line and "--bandwidth" in line
