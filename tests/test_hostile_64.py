"""Damaged inputs of the features of stop 63 (``bench/damage_64.py`` sweeps them): each was answered with exit 0 and no
word, or refused without naming the problem, before; one check per fix. Every damaged copy is made here from a vendored
fixture (``replicate/realnvp``: the composable ``replicate()``; ``fsdp-fresh/a2c-roots``: FSDP2 of two roots)."""
from __future__ import annotations

import pytest
from testdata import DATA, cli_json, copy_fixture, edit_json


def _refused(capsys, *argv) -> str:
    rc, _, err = cli_json(capsys, *map(str, argv))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("change", [lambda d: d.update(ddp_api=""), lambda d: d.pop("ddp_api")])
def test_ranks_whose_ddp_another_api_built_are_refused(tmp_path, capsys, change):
    """Rank 1's file saying DistributedDataParallel (or, as an older file, nothing) beside rank 0's replicate() was read as
    rank 0's: the graph's label and ``optimize``'s answer came from rank 0 alone, with no word."""
    run = copy_fixture(tmp_path, "replicate/realnvp")
    edit_json(run / "rank1.json", change)
    for argv in (["analyze", "--json", run], ["whatif", "--json", run, "--bucket-mb", "4", "--no-trace"]):
        line = _refused(capsys, *argv)
        assert f"{run / 'rank1.json'}: its gradients are reduced by DDP, rank0.json's by replicate() (DDP) (ddp_api)" in line, line
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(DATA / "replicate" / "realnvp"))
    assert rc == 0 and doc["measured_iter_ms"] > 0, err


def test_a_unit_whose_root_differs_on_one_rank_names_the_field(tmp_path, capsys):
    """A unit of the second ``fully_shard`` root marked as another root on rank 1 was refused as "its unit 4 is FSDPTower1
    (...), rank 0's FSDPTower1 (...)": the same words twice, the difference unnamed."""
    run = copy_fixture(tmp_path, "fsdp-fresh/a2c-roots")

    def damage(doc):
        for u in doc["fsdp"]["units"]:
            if u["root"] == 1:
                u["root"] = 6
    edit_json(run / "rank1.json", damage)
    line = _refused(capsys, "analyze", "--json", run)
    assert f"{run / 'rank1.json'}: its unit 4 (FSDPTower1) has root 6, rank 0's 1: every rank of an FSDP job" in line, line



def _drop_every_other_end(name: str):
    def damage(doc):
        ends = [e for e in doc["traceEvents"] if e.get("name") == name and e.get("ph") == "E"][::2]
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not any(e is x for x in ends)]
    return damage


def _move_every_other_end(name: str):
    def damage(doc):
        for e in [e for e in doc["traceEvents"] if e.get("name") == name and e.get("ph") == "E"][::2]:
            e["ts"] -= 10_000_000
    return damage


@pytest.mark.parametrize(("file", "name", "damage"), [
    ("server0.json.gz", "DequantizeCPU", _drop_every_other_end), ("server0.json.gz", "DequantizeCPU", _move_every_other_end),
    ("worker1.json.gz", "QuantizeCPU", _drop_every_other_end)])
def test_mxnet_quantize_spans_that_lost_their_end_are_counted_not_paired_with_the_next(tmp_path, capsys, file, name, damage):
    """A (de)quantize span whose end was lost took the next span's end (paired first-in first-out): the server's spans
    covered its idle time (predicted 33.3 -> 397.9 ms, no word). No two such spans overlap on a thread in any vendored
    trace, so a begin meeting an open one means the open one lost its end: it is left out, and counted."""
    _, clean, _ = cli_json(capsys, "analyze", "--json", str(DATA / "mxnet/user_bow_2bit"))
    run = copy_fixture(tmp_path, "mxnet/user_bow_2bit")
    edit_json(run / file, damage(name))
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(run))
    assert rc == 0, err
    assert abs(doc["predicted_iter_ms"] / clean["predicted_iter_ms"] - 1) < 0.01, (doc["predicted_iter_ms"], clean["predicted_iter_ms"])
    said = [w for w in doc["warnings"] if f" {name} begin/end events pair with none" in w]
    assert len(said) == 1 and said[0].startswith(f"{file}: "), doc["warnings"]
    assert not any("pair with none" in w for w in clean["warnings"]), clean["warnings"]


def _mark(rank: int):
    """The collector's rank mark, as MXNet 1.9.1 writes a ``Marker(Domain("dagprof"), ...).mark("process")``."""
    def damage(doc):
        doc["traceEvents"].append({"name": f"worker {rank}", "cat": "dagprof,instant_marker", "ph": "n", "s": "p",
                                   "ts": doc["traceEvents"][-1].get("ts", 0), "pid": 10612053633361504641, "tid": 1})
    return damage


def test_mxnet_workers_traces_swapped_are_refused_by_their_collector_s_marks(tmp_path, capsys):
    """Worker 0's and worker 1's traces swapped read silently (analyze 33.23 -> 31.21 ms): mx.profiler records no worker
    id, and the two workers' clocks line up. The collector now marks each trace with its worker; marked alike, the run
    reads as before."""
    run = copy_fixture(tmp_path, "mxnet/user_bow_2bit")
    for w in (0, 1):
        edit_json(run / f"worker{w}.json.gz", _mark(w))
    _, clean, _ = cli_json(capsys, "analyze", "--json", str(DATA / "mxnet/user_bow_2bit"))
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(run))
    assert rc == 0 and doc["predicted_iter_ms"] == clean["predicted_iter_ms"], err
    (run / "worker0.json.gz").rename(run / "tmp.json.gz")
    (run / "worker1.json.gz").rename(run / "worker0.json.gz")
    (run / "tmp.json.gz").rename(run / "worker1.json.gz")
    line = _refused(capsys, "analyze", "--json", run)
    assert f"{run / 'worker0.json.gz'}: its collector marked it as worker 1, but mxnet-run.json lists it as worker 0's" in line, line


def test_mxnet_compressed_pushes_without_their_quantize_spans_are_said(tmp_path, capsys):
    """Every ``QuantizeCPU`` event removed from worker 1: its compressed pushes read as waiting for nothing, with no word.
    Each compressed push quantizes its gradient first (604 of 604 in the vendored traces): fewer quantize spans are said."""
    run = copy_fixture(tmp_path, "mxnet/user_bow_2bit")
    edit_json(run / "worker1.json.gz", lambda doc: doc.update(traceEvents=[e for e in doc["traceEvents"] if e.get("name") != "QuantizeCPU"]))
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(run))
    assert rc == 0, err
    said = [w for w in doc["warnings"] if "compressed pushes (KVStoreDistCompressedPush)" in w]
    assert len(said) == 1 and said[0].startswith("worker1.json.gz: ") and " but 0 QuantizeCPU spans" in said[0], doc["warnings"]
