"""Damaged copies of the vendored runs, one check per reader (``bench/damage_inputs.py`` audits them all).

Each case was once read with exit 0 and an unchanged or unflagged number: a rank file beyond the
manifest's ranks (a copy), a dagprof run's Kineto trace of another rank, loop step times gone or
running backwards, the events a run's Kineto trace dropped unsaid, one Kineto rank without step
markers, a Kineto rank damaged into another JSON named only as "no trace file here".
Every copy is made in the test from the fixture; nothing under tests/data changes.
"""
from __future__ import annotations

import json
import re
import shutil

import pytest
from testdata import DATA, copy_fixture, edit_json, load_refused

from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.traces.layerwise import read_layer_file
from dagprof.traces.load import load


@pytest.mark.parametrize("fixture, copy", [("run_schema/v1", "rank2.json"), ("tf/text", "rank2.json"),
                                           ("horovod/fused", "rank2.horovod.json")])
def test_a_rank_file_beyond_the_manifests_ranks_isload_refused(tmp_path, fixture, copy):
    run = copy_fixture(tmp_path, fixture)
    shutil.copy(run / copy.replace("2", "0"), run / copy)  # read before as the 2 ranks alone, the copy unseen
    load_refused(run, str(run / copy), "named for rank 2, but manifest.json says 2 ranks")


@pytest.mark.parametrize("damage, needle", [
    (lambda d: d.update(step_times_ns=[]), "profiled step(s) have no time in step_times_ns"),
    (lambda d: d["step_times_ns"][-1].__setitem__(2, -1), "end before they begin"),
])
def test_loop_step_times_gone_or_backwards_areload_refused(tmp_path, damage, needle):
    run = copy_fixture(tmp_path, "run_schema/v1")
    edit_json(run / "rank1.json", damage)  # read before: the profiler's cost judged on them
    load_refused(run, str(run / "rank1.json"), needle)


def test_a_runs_kineto_trace_of_another_rank_isload_refused(tmp_path):
    run = copy_fixture(tmp_path, "hybrid-dp-tp-dagprof")
    ranks = []
    for r in (0, 1):
        edit_json(run / f"rank{r}.kineto.json.gz", lambda d: ranks.append(d["distributedInfo"]["rank"]))
    assert ranks == [0, 1]
    for r in (0, 1):  # the two traces swapped: read before as rank 0's and rank 1's communication
        edit_json(run / f"rank{r}.kineto.json.gz", lambda d, r=r: d["distributedInfo"].update(rank=1 - r))
    load_refused(run, str(run / "rank0.kineto.json.gz"), "distributedInfo says rank 1, but it is read as rank 0's trace")


def test_events_a_runs_kineto_trace_drops_are_counted(tmp_path):
    run = copy_fixture(tmp_path, "hybrid-dp-tp-dagprof")

    def negative(doc):
        timed = [e for e in doc["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float)) and e["dur"] > 0]
        for e in timed[-4:]:
            e["dur"] = -e["dur"]
    edit_json(run / "rank1.kineto.json.gz", negative)
    warnings = [str(w) for w in load(run).meta.warnings]  # read before with none said
    assert any(re.match(r"rank1\.kineto\.json\.gz: [1-4] of \d+ complete events unreadable", w) for w in warnings), warnings


def test_one_kineto_rank_without_step_markers_is_named(tmp_path, capsys):
    run = copy_fixture(tmp_path, "gloo-windows/same")
    edit_json(run / "rank-1.pt.trace.json.gz",
          lambda d: d.update(traceEvents=[e for e in d["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")]))
    assert main(["analyze", str(run)]) == 2  # was "mismatched collectives", naming neither file
    err = capsys.readouterr().err
    assert str(run / "rank-1.pt.trace.json.gz") in err and "no ProfilerStep markers, but 1 other rank(s) have them" in err


def test_a_kineto_rank_damaged_into_another_json_is_named(tmp_path):
    run = copy_fixture(tmp_path, "gloo-windows/same")
    edit_json(run / "rank-1.pt.trace.json.gz", lambda d: d.update(traceEvents={"events": d["traceEvents"][:1]}))
    load_refused(run, "rank 1 of 2: no trace file here", "skipped: rank-1.pt.trace.json.gz (not a Kineto trace")


@pytest.mark.parametrize("damage, needle", [
    (lambda d: d.update(step_times_us={}), "4 profiled step(s) have no time in step_times_us"),
    (lambda d: d["step_times_us"].update({"6": -1.0}), "Expected `float` > 0.0 - at `$.step_times_us[...]`"),
    (lambda d: d.update(step_times_us=[d["step_times_us"]]), "at `$.step_times_us`"),  # was an AttributeError (exit 3)
])
def test_a_damaged_tf_rank_file_names_the_field(tmp_path, damage, needle):
    run = copy_fixture(tmp_path, "tf/text")
    edit_json(run / "rank1.json", damage)
    load_refused(run, str(run / "rank1.json"), needle)


@pytest.mark.parametrize("damage, needle", [
    (lambda d: d["enqueues"][0].__setitem__(4, d["enqueues"][0][4] * 2), "1 all-reduce(s) sized unlike rank 0's"),
    (lambda d: d["enqueues"][0].__setitem__(3, d["enqueues"][0][2] - 1), "1 request(s) end before they begin"),
    (lambda d: [q.__setitem__(i, q[i] + 3_600_000_000_000) for q in d["enqueues"] for i in (2, 3)],
     "timed more than a second outside them"),
    (lambda d: d.update(settings=[d["settings"]]), "at `$.settings`"),  # was a ValueError (exit 3)
])
def test_a_damaged_horovod_rank_file_isload_refused(tmp_path, damage, needle):
    run = copy_fixture(tmp_path, "horovod/fused")
    edit_json(run / "rank1.horovod.json", damage)  # the first three were read with exit 0 and the number unchanged
    load_refused(run, str(run / "rank1.horovod.json"), needle)


def test_an_mxnet_step_running_backwards_isload_refused(tmp_path):
    run = copy_fixture(tmp_path, "mxnet/user_mlp")
    edit_json(run / "mxnet-run.json", lambda d: d["steps"]["0"][0].__setitem__(2, -1))
    load_refused(run, str(run / "mxnet-run.json"), "1 step time(s) end before they begin", "worker 0")


def test_a_layer_csv_cut_inside_a_row_isload_refused(tmp_path):
    whole = "layer,forward_us,backward_us,grad_bytes\nconv1,100,200,40000\nfc,50,100,1000\n"
    cut = tmp_path / "layers.csv"
    cut.write_text(whole[:-4])  # "fc,50,100,1" was read as a valid, smaller model
    with pytest.raises(DagprofError, match=r"layers\.csv: line 3, the last, has no end of line: the file was cut short"):
        read_layer_file(cut)


def test_a_bcaffe_log_cut_at_a_line_end_isload_refused(tmp_path):
    lines = (DATA / "bcaffe-k80-googlenet" / "tmp4comm.log").read_text().splitlines(keepends=True)
    assert len(lines) == 256  # two dumps of 128 blobs
    cut = tmp_path / "tmp4comm.log"
    cut.write_text("".join(lines[:200]))  # its last dump's 72 blobs were read as a 36-layer model
    with pytest.raises(DagprofError, match=r"tmp4comm\.log: line 129: the last dump has 72 blobs, the one before 128"):
        read_layer_file(cut)


def test_an_mxnet_workers_trace_copied_over_anothers_is_refused_naming_both(tmp_path):
    run = copy_fixture(tmp_path, "mxnet/user_mlp")
    shutil.copy(run / "worker0.json.gz", run / "worker1.json.gz")  # mx.profiler records no worker id: read as worker 1 before
    load_refused(run, str(run / "worker1.json.gz"), "same operator spans at the same times as worker0.json.gz (worker 0's)")


def test_an_mxnet_worker_file_the_manifest_does_not_list_isload_refused(tmp_path):
    run = copy_fixture(tmp_path, "mxnet/user_mlp")
    shutil.copy(run / "worker0.json.gz", run / "worker2.json.gz")  # read before as the 2 listed workers, the copy unseen
    load_refused(run, str(run / "worker2.json.gz"), "lists workers [0, 1] with other files")


def test_swapped_mxnet_worker_traces_are_refused_by_their_profiler_edges(tmp_path):
    """Was warned (its 41 push calls fall 13, 14, 14 into worker 0's 3 profiled steps); worker 1's trace begins 17.8 ms
    before worker 0 started its profiler (hostile65)."""
    run = copy_fixture(tmp_path, "mxnet/user_mlp")
    (run / "worker0.json.gz").rename(run / "tmp")
    (run / "worker1.json.gz").rename(run / "worker0.json.gz")
    (run / "tmp").rename(run / "worker1.json.gz")
    load_refused(run, str(run / "worker0.json.gz"), "its first event is 17.82 ms before worker 0 started its profiler")
    assert not [w for t in load(DATA / "mxnet/user_mlp").ranks for w in t.meta.warnings]  # the undamaged run says nothing


@pytest.mark.parametrize("fixture, session", [("tf/text", "2026_12_02_01_16_53"), ("tf-jax/pmap-host", "2026_12_03_10_29_30")])
def test_an_xplane_copied_over_another_ranks_is_refused_naming_both(tmp_path, fixture, session):
    run = copy_fixture(tmp_path, fixture)
    xp = f"plugins/profile/{session}/vm.xplane.pb.gz"
    shutil.copy(run / "rank0" / xp, run / "rank1" / xp)  # read before with exit 0 and a number 0.9 % off (tf/text)
    load_refused(run, str(run / "rank1" / xp), f"same events at the same times as rank0/{xp} (rank 0)")


def _fsdp_units(doc, edit):
    for u in doc["fsdp"]["units"]:
        edit(u)


@pytest.mark.parametrize("ranks, edit, needle", [
    ((0, 1, 2, 3), lambda u: u.update(mesh=[3, 2]), "unit <root>'s mesh 3x2 does not fit the job's 4 ranks"),
    ((1,), lambda u: u.update(mesh=[1, 4]), "collective 0 (all_gather) runs on ranks 0,1, but rank 1's unit <root> has mesh 1x4"),
    ((1,), lambda u: u.update(name=u["name"] + "_x"), "its unit 0 is <root>_x (mesh 2x2, 3 parameters, 33,024 elements), rank 0's <root>"),
])
def test_fsdp_units_unlike_the_job_or_the_other_ranks_areload_refused(tmp_path, ranks, edit, needle):
    run = copy_fixture(tmp_path, "fsdp/hsdp")  # each read before with exit 0, and --mesh re-priced from rank 0's units
    for r in ranks:
        edit_json(run / f"rank{r}.json", lambda d: _fsdp_units(d, edit))
    load_refused(run, str(run / f"rank{ranks[-1] if len(ranks) == 1 else 0}.json"), needle)


@pytest.mark.parametrize("fixture, flags, needle", [
    ("ddp-testbed/run", ["--ranks-per-host", "2"], "--ranks-per-host: is read only with --cores"),  # was ignored, exit 0
    ("hybrid-dp-tp", ["--mesh", "1x2"], "--mesh: is an FSDP what-if; this profile is not an FSDP job"),  # was the model check's line
    ("hybrid-dp-tp", ["--tp-degree", "3"], "--tp-degree: a TP degree of 3 is not modelled (profiled: 2)"),  # named no flag
])
def test_whatif_flags_that_cannot_apply_are_refused_naming_the_flag(capsys, fixture, flags, needle):
    assert main(["whatif", str(DATA / fixture), *flags, "--no-trace"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err


def test_a_link_fit_without_a_bandwidth_says_so_in_words(capsys):
    assert main(["whatif", str(DATA / "fsdp/hsdp"), "--mesh", "2x3", "--no-trace", "--json"]) == 0
    link = json.loads(capsys.readouterr().out)["link"]
    assert "inf" not in link and "no bandwidth limit seen" in link  # "inf Gbit/s" read as a non-finite number


def test_an_fsdp_collective_naming_a_unit_the_file_lacks_isload_refused(tmp_path):
    run = copy_fixture(tmp_path, "fsdp/hsdp")
    edit_json(run / "rank1.json", lambda d: d["fsdp"]["collectives"][0].update(prefetched_by=7))  # was an IndexError's line
    load_refused(run, str(run / "rank1.json"), "1 FSDP collective(s) name unit 7, but the file lists 3 units")


def test_an_fsdp_collective_of_no_kind_isload_refused(tmp_path):
    run = copy_fixture(tmp_path, "fsdp/hsdp")
    edit_json(run / "rank1.json", lambda d: d["fsdp"]["collectives"][0].update(kind="all_gather_object"))  # was a bare KeyError
    load_refused(run, str(run / "rank1.json"), "is of kind 'all_gather_object', which no collective is")


@pytest.mark.parametrize("flags, needle", [
    (["--rounds", "5"], "--rounds: is read only with --verify"),  # each was ignored, exit 0, the search as without it
    (["--ranks", "2"], "--ranks: is read only with --verify"),
    (["--ranks", "2", "--emulate", "1Gbit"], "--emulate: is read only with --verify"),
    (["--powersgd-ranks", "8"], "--powersgd-ranks: is read only with --allow-lossy"),
])
def test_optimize_flags_read_only_with_another_are_refused_alone(tmp_path, capsys, flags, needle):
    assert main(["optimize", str(DATA / "ddp-testbed/run"), *flags, "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err
