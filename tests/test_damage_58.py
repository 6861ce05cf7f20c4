"""A reviewer's damages (``bench/damage_58.py`` sweeps them over every reader), one check per fix.

Each was answered before with exit 0 and a wrong number or an unclear failure. Every copy is made in the test from a
vendored fixture; nothing under tests/data changes.
"""
from __future__ import annotations

import random

from testdata import cli_json, copy_fixture, edit_json, load_refused

from dagprof.cli.main import main

SEC_NS = 1_000_000_000


def _shift(doc: dict, ns: int) -> None:
    """Every wall-clock time of a rank file moved by ``ns`` (its host's clock off): the monotonic clock stays."""
    for row in doc["step_times_ns"]:
        row[1] += ns
        row[2] += ns
    for row in doc["records"]:
        row[3] += ns
    doc["clock"]["unix_ns"] += ns


def test_a_rank_clock_seconds_off_on_one_named_host_is_aligned_not_renumbered(tmp_path, capsys):
    """Two ranks naming one host, one clock 3 s off: the steps were renumbered by time (+7) and the replay, of other
    steps, predicted 217.9 ms for 205.7 with only a window warning; the clocks are aligned on the collectives instead."""
    run = copy_fixture(tmp_path, "ddp-testbed/run")
    rc, clean, _ = cli_json(capsys, "analyze", "--json", str(run))
    assert rc == 0
    edit_json(run / "rank1.json", lambda d: _shift(d, 3 * SEC_NS))
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(run))
    assert rc == 0, err
    assert doc["predicted_iter_ms"] == clean["predicted_iter_ms"]
    assert doc["measured_iter_ms"] == clean["measured_iter_ms"]
    assert not any("renumbered" in w for w in doc["warnings"]), doc["warnings"]
    assert abs(doc["clock_alignment"]["offset_us"]["1"] + 3e6) < 1e4


def test_an_mxnet_trace_whose_events_are_out_of_order_reads_as_in_order(tmp_path, capsys):
    """Its B/E pairs were paired in the file's order: shuffled, the spans came out wrong and the link fit failed with a
    line naming no file (a negative fixed cost); the trace format orders them by time, and so does the reader now."""
    run = copy_fixture(tmp_path, "mxnet/user_mlp")
    rc, clean, _ = cli_json(capsys, "analyze", "--json", str(run))
    assert rc == 0
    edit_json(run / "worker1.json.gz", lambda d: random.Random(58).shuffle(d["traceEvents"]))
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(run))
    assert rc == 0, err
    assert doc["predicted_iter_ms"] == clean["predicted_iter_ms"] and doc["warnings"] == clean["warnings"]


def test_an_mxnet_time_past_a_doubles_microseconds_is_refused_naming_the_file(tmp_path):
    """Times moved past 2**53 us collapse onto each other: read before as 'spans written twice'."""
    run = copy_fixture(tmp_path, "mxnet/user_mlp")

    def far(doc):
        for e in doc["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += 1e18
    edit_json(run / "worker1.json.gz", far)
    load_refused(run, "worker1.json.gz", "no microsecond count")


def test_a_layer_csv_of_zero_times_is_refused_naming_the_file(tmp_path, capsys):
    """Every layer 0 us (a warm-up's dump written out): ``sgd`` failed as an internal error (a division by the zero
    iteration), where the B-Caffe log reader refuses such a dump."""
    path = tmp_path / "layers.csv"
    path.write_text("layer,forward_us,backward_us,grad_bytes,allreduce_us\n" + "".join(f"l{k},0,0,4096,0\n" for k in range(4)))
    rc = main(["sgd", str(path), "--workers", "1,4", "--net", "10gbe"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and str(path) in err and "time is 0" in err and "\n" not in err


def test_a_jax_rank_whose_steps_are_relabelled_is_refused_naming_the_offset(tmp_path, capsys):
    """Rank 1's step times keyed 3 steps on (another window's file, or renumbered): XLA's sequence numbers carry the
    step, so they paired its step 6 with rank 0's step 9, aligned the clocks 143 ms (three steps) apart and answered
    49.93 ms for 46.21 with only a window warning; on their one clock the collectives tell, and the run is refused."""
    run = copy_fixture(tmp_path, "tf-jax/pmap-host")

    def relabel(doc):
        doc["step_times_us"] = {str(int(k) + 3): v for k, v in doc["step_times_us"].items()}
        doc["steps_profiled"] = [s + 3 for s in doc["steps_profiled"]]
    edit_json(run / "rank1.json", relabel)
    rc, _, text = cli_json(capsys, "analyze", "--json", str(run))
    assert rc == 2 and text.count("\n") == 1 and str(run) in text
    assert "rank 1's step numbers disagree with rank 0's by -3" in text and "step 9 end with rank 0's of step 6" in text
