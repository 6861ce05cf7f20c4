"""Damaged inputs of the features of stops 60-62 (``bench/damage_63.py`` sweeps them): each was answered with exit 0 and
no word, or an internal error, before; one check per fix. Every damaged copy is made here from a vendored fixture
(``tests/data/link-v5``: two ``dagprof calibrate`` files, version 5, of 2 and 4 gloo ranks on this machine)."""
from __future__ import annotations

import json

import pytest
from testdata import DATA, cli_json, copy_fixture, edit_json

W2, W4 = DATA / "link-v5" / "gloo-w2.json", DATA / "link-v5" / "gloo-w4.json"
RUN2 = DATA / "ddp-testbed" / "run"  # 2 gloo ranks


def _damaged(tmp_path, change, src=W2):
    doc = json.loads(src.read_text())
    change(doc)
    bad = tmp_path / "link.json"
    bad.write_text(json.dumps(doc))
    return bad


def _refused(capsys, *argv) -> str:
    rc, _, err = cli_json(capsys, *map(str, argv))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("change,why", [
    (lambda d: d["times_us"].__setitem__(1, d["times_us"][1][:1]), "times_us[1] holds 1 rank(s)' times, the sweep ran on 2"),
    (lambda d: d["kinds"]["all_gather"]["times_us"][0].pop(), "kinds.all_gather.times_us[0] holds 1 rank(s)' times, the sweep ran on 2"),
    (lambda d: d.update(cpus=-2), "cpus must be the count of CPUs the sweep's ranks ran on (an integer >= 1), got -2"),
    (lambda d: d.update(cpus="two"), "cpus must be the count of CPUs the sweep's ranks ran on (an integer >= 1), got 'two'"),
    (lambda d: d.update(load=["high", "low"]), "load must be the load averages before and after the sweep (finite numbers >= 0)"),
    (lambda d: d.update(load=[float("nan"), 1.0]), "load must be the load averages before and after the sweep (finite numbers >= 0)"),
])
def test_a_damaged_version_5_calibration_names_the_file_and_field(tmp_path, capsys, change, why):
    """A size that lost a rank's row was read at the quietest repetition of the ranks left; ``cpus`` and ``load`` were not read
    at all (``load`` as words was an internal error where the line that says what the sweep read formats it)."""
    bad = _damaged(tmp_path, change)
    for argv in (["whatif", "--json", RUN2, "--link-from", bad, "--link-to", W2, "--no-trace"],
                 ["sgd", "--json", DATA / "bcaffe-k80-googlenet" / "tmp4comm.log", "--workers", "1,4", "--link-model", bad]):
        line = _refused(capsys, *argv)
        assert f"{bad}: {why}" in line, line


def test_link_from_of_other_ranks_or_another_backend_than_the_run_is_refused(tmp_path, capsys):
    """Two 4-rank calibrations given for a 2-rank run (or an NCCL one for a gloo run) were read as the run's link measured
    alike; the pair's ratio answered with no word where the fit happened to sit near the run's own."""
    line = _refused(capsys, "whatif", "--json", RUN2, "--link-from", W4, "--link-to", W4, "--no-trace")
    assert line.endswith(f"{W4}: calibrated on 4 ranks, this run has 2: --link-from and --link-to are read as the profiled link "
                         "measured alike (dagprof calibrate --world 2 on each link)"), line
    nccl = _damaged(tmp_path, lambda d: d.update(backend="nccl"))
    line = _refused(capsys, "whatif", "--json", RUN2, "--link-from", nccl, "--link-to", W2, "--no-trace")
    assert f"{nccl}: calibrated on nccl, this run's collectives ran on gloo" in line, line
    rc, doc, err = cli_json(capsys, "whatif", "--json", str(RUN2), "--link-from", str(W2), "--link-to", str(W2), "--no-trace")
    assert rc == 0 and abs(doc["scenarios"][0]["predicted_iter_ms"] - doc["measured_iter_ms"]) < 1e-6 * doc["measured_iter_ms"], err


def test_optimize_of_a_job_of_several_roots_names_the_run(tmp_path, capsys):
    """The refusal said why but named neither the run nor a flag; what is still refused there names the run too."""
    run = DATA / "fsdp-fresh" / "a2c-roots"
    line = _refused(capsys, "whatif", "--json", run, "--data-parallel", "ddp", "--bucket-mb", "1", "--no-trace")
    assert f"{run}: --data-parallel ddp with --bucket-mb or --no-overlap: this job has 2 fully_shard roots" in line, line


@pytest.mark.parametrize("value", [float("nan"), -6854612.0])
def test_a_horovod_timeline_time_not_a_time_is_refused(tmp_path, capsys, value):
    """A negotiation's start read as NaN (or before the timeline began) was taken as written: the loaded fixture's
    negotiations, which the load pass scales, then began at no time."""
    run = copy_fixture(tmp_path, "horovod/pinned-loaded")
    timeline = run / "horovod_timeline.json"

    def damage(events):
        first = next(e for e in events if e.get("ph") == "B" and str(e.get("name", "")).startswith("NEGOTIATE_"))
        first["ts"] = value
    edit_json(timeline, damage)
    line = _refused(capsys, "whatif", "--json", run, "--bandwidth", "200Mbit", "--no-trace")
    assert f"{timeline}: event 'NEGOTIATE_ALLREDUCE' (ph 'B') has ts {value!r}" in line and "finite and >= 0" in line, line


def test_mxnet_kvstore_spans_that_do_not_pair_are_counted(tmp_path, capsys):
    """Half of a 2-bit job's compressed pushes with their begin renamed no longer pair: the reader dropped both ends unseen
    (analyze 243.3 -> 238.9 ms, no word). No vendored mx.profiler trace has such an event."""
    run = copy_fixture(tmp_path, "mxnet/user_resnet_2bit")
    worker = run / "worker1.json.gz"

    def damage(doc):
        begins = [e for e in doc["traceEvents"] if e.get("ph") == "B" and e.get("name") == "KVStoreDistCompressedPush"]
        for e in begins[::2]:
            e["name"] = "KVStoreDistPush"
    edit_json(worker, damage)
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(run))
    said = [w for w in doc["warnings"] if "pair with none" in w]
    assert rc == 0 and len(said) == 1 and said[0].startswith("worker1.json.gz: ") and "in worker 1's profiled steps" in said[0], err
    lost = int(said[0].split(": ")[1].split()[0])
    rc, clean, _ = cli_json(capsys, "analyze", "--json", str(DATA / "mxnet" / "user_resnet_2bit"))
    assert lost > 0 and not [w for w in clean["warnings"] if "pair with none" in w]
