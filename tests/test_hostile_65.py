"""Damaged inputs that read with exit 0 and no word before (``bench/damage_65.py`` sweeps them): one check per fix. Every
damaged copy is made here from a vendored fixture (``mxnet/user_bow_2bit``: 2-bit compressed pushes, traces collected
before the collector marked each worker's; ``ddp-fresh/dcp-kineto`` and ``dcp-kineto-early``: a user's Kineto traces of a
DDP job saving with DCP after its optimizer step and before its next forward)."""
from __future__ import annotations

import shutil

import pytest
from testdata import DATA, cli_json, copy_fixture, edit_json


def _refused(capsys, *argv) -> str:
    rc, _, err = cli_json(capsys, *map(str, argv))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    return lines[0]


def _swap(run, a: str, b: str) -> None:
    (run / a).rename(run / "tmp.json.gz")
    (run / b).rename(run / a)
    (run / "tmp.json.gz").rename(run / b)


@pytest.mark.parametrize(("fixture", "said"), [
    ("mxnet/user_bow_2bit", "worker0.json.gz: its first event is 1.12 ms before worker 0 started its profiler (the start of step 3 "
                            "in mxnet-run.json): another worker's trace"),
    ("mxnet/testbed_attn/warmup_s1_500M", "worker1.json.gz: its last event, the profiler's stop, is 0.36 ms before worker 1 "
                                          "stopped it (the end of step 7 in mxnet-run.json): another worker's trace")])
def test_unmarked_mxnet_worker_traces_swapped_are_refused_by_the_profiler_s_edges(tmp_path, capsys, fixture, said):
    """Traces collected before the collector's rank mark: worker 0's and 1's swapped read silently (analyze 33.23 -> 31.21
    ms). Each worker starts its profiler just before it times the step before the window and stops it just after the
    window's last step, on its own clock: a trace that begins before its worker's start, or whose stop comes before its
    worker's, is another worker's."""
    _, clean, _ = cli_json(capsys, "analyze", "--json", str(DATA / fixture))
    assert clean is not None and clean["predicted_iter_ms"] > 0
    run = copy_fixture(tmp_path, fixture)
    _swap(run, "worker0.json.gz", "worker1.json.gz")
    line = _refused(capsys, "analyze", "--json", run)
    assert f"{run}/{said}" in line, line


def test_an_mxnet_worker_s_trace_copied_over_another_s_is_refused_as_read(tmp_path, capsys):
    """Worker 0's trace copied over worker 1's read silently (the copy check compared the spans binned into each worker's
    steps from the manifest, which differ): the spans as read are the same."""
    run = copy_fixture(tmp_path, "mxnet/user_bow_2bit")
    shutil.copy(run / "worker0.json.gz", run / "worker1.json.gz")
    line = _refused(capsys, "analyze", "--json", run)
    assert f"{run}/worker1.json.gz: holds the same operator spans at the same times as worker0.json.gz (worker 0's)" in line, line


def test_a_compressed_run_s_server_without_dequantize_spans_is_said(tmp_path, capsys):
    """Every ``DequantizeCPU`` removed from the server of a 2-bit run read as before with no word; the workers' compressed
    pushes say the server dequantized each part it got (22 a step, as many as pushed, in the vendored trace)."""
    run = copy_fixture(tmp_path, "mxnet/user_bow_2bit")
    edit_json(run / "server0.json.gz", lambda doc: doc.update(traceEvents=[e for e in doc["traceEvents"] if e.get("name") != "DequantizeCPU"]))
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(run))
    assert rc == 0, err
    said = [w for w in doc["warnings"] if "DequantizeCPU spans in the profiled steps" in w]
    assert said == ["server0.json.gz: 0 DequantizeCPU spans in the profiled steps, but the workers' 2-bit compressed pushes put 66 "
                    "parts on server 0, each dequantized there (removed or renamed events): its busy time is read without them"], doc["warnings"]
    _, clean, _ = cli_json(capsys, "analyze", "--json", str(DATA / "mxnet/user_bow_2bit"))
    assert not any("DequantizeCPU" in w for w in clean["warnings"]), clean["warnings"]


def _dims(run) -> dict:
    from dagprof.pipeline import open_run

    (group,) = open_run(run).graph.meta.parallel.groups
    return group.dims


def test_a_dcp_save_before_the_next_forward_is_the_job_s_own(capsys):
    """The same saves as dcp-kineto's, made at the top of the next iteration (before DDP's forward) rather than after
    ``opt.step()``: "18 DP, 24 unknown", its object collectives scaled by ``--workers`` as gradients. Between an optimizer
    step and the next forward range nothing exchanges gradients: 6 DP (the all-reduces), 36 job-own, as after the step."""
    run = DATA / "ddp-fresh/dcp-kineto-early"
    assert _dims(run) == {"DP": 3 * 2, "job-own": 18 * 2}
    rc, doc, err = cli_json(capsys, "whatif", "--json", str(run), "--workers", "4", "--allow-model-error", "--no-trace")
    assert rc == 0 and doc["scenarios"][0]["predicted_iter_ms"] > 0, err
    assert _dims(DATA / "ddp-fresh/dcp-kineto") == {"DP": 6, "job-own": 36}


def test_a_job_s_own_collectives_in_a_group_described_as_dp_are_not_dp(tmp_path):
    """dcp-kineto with its one group described ``mesh_dp`` (a DeviceMesh named "dp"): the description won over where the
    collectives ran, and the save's 36 read DP. A DP group's collectives after the optimizer step carry no gradients."""
    run = copy_fixture(tmp_path, "ddp-fresh/dcp-kineto")
    for f in run.iterdir():
        edit_json(f, lambda doc: doc["distributedInfo"]["pg_config"][0].update(pg_desc="mesh_dp"))
    assert _dims(run) == {"DP": 6, "job-own": 36}


@pytest.mark.parametrize(("argv", "said"), [
    (["sgd", "RUN"], "RUN/rank0.json: no all-reduce cost for 2 workers: give --net, an OSU table or a measured comm log (it measured "
                     "no all-reduce at 2 workers)"),
    (["optimize", "RUN", "--budget", "1", "-o", "OUT"], "RUN: the search of reshard, units and reduce dtype: this job's units are "
                                                         "torch's FSDP-based replicate()")])
def test_refusals_on_replicate_with_fsdp_name_the_run(tmp_path, capsys, argv, said):
    """``sgd`` and ``optimize`` of a ``replicate_with_fsdp`` run were refused in one line naming neither the run nor a flag."""
    run = str(DATA / "replicate/with-fsdp")
    line = _refused(capsys, *[{"RUN": run, "OUT": str(tmp_path)}.get(a, a) for a in argv])
    assert said.replace("RUN", run) in line, line
