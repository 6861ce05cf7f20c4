"""Damaged inputs that read with exit 0 and no word before (``bench/damage_66.py`` sweeps them): one check per fix. Every
damaged copy is made here from a vendored fixture (``powersgd-ctr/defaults``: the CTR ranker's profile under
``replicate()``, 2 gloo ranks at 200 Mbit/s; ``tf/translator-pack``: TF's packed all-reduce sized by its row bytes;
``fsdp-fresh/dual-1x2-1gbit``: HSDP profiled at 1 Gbit/s)."""
from __future__ import annotations

import pytest
from testdata import DATA, cli_json, copy_fixture, edit_json


def _refused(capsys, *argv) -> str:
    rc, _, err = cli_json(capsys, *map(str, argv))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(("field", "value", "said"), [
    ("comm_hook", "powerSGD_hook", "its comm_hook is 'powerSGD_hook', rank0.json's ''"),
    ("bucket_cap_mb", 25.0, "its bucket_cap_mb is 25.0, rank0.json's 0.09999942779541016"),
    ("find_unused", True, "its find_unused is True, rank0.json's False")])
def test_a_ddp_rank_wrapped_otherwise_than_rank_0_is_refused(tmp_path, capsys, field, value, said):
    """Rank 1's file naming a PowerSGD comm hook, another bucket cap or ``find_unused_parameters`` read silently as rank
    0's (both are read from rank 0 alone; analyze 375.15 ms either way): every rank of a job passes DDP the same."""
    run = copy_fixture(tmp_path, "powersgd-ctr/defaults")
    edit_json(run / "rank1.json", lambda doc: doc.update({field: value}))
    line = _refused(capsys, "analyze", "--json", run)
    assert f"{run}/rank1.json: {said}: every rank of a job wraps its model alike" in line, line


@pytest.mark.parametrize(("edit", "said"), [
    (lambda doc: doc["collective_row_bytes"].update({"CollectiveReduceV2_1": 8}),
     "its collective_row_bytes['CollectiveReduceV2_1'] is 8, rank0.json's 4"),
    (lambda doc: doc["collective_lookups"].update({"cond_1/then/cond_1/CollectiveGatherV2": ["model/other/embedding_lookup"]}),
     "its collective_lookups['cond_1/then/cond_1/CollectiveGatherV2'] is ['model/other/embedding_lookup'], rank0.json's "
     "['model/positional_embedding/embedding/embedding_lookup']"),
    (lambda doc: doc.update(embedding_grad_bytes=7), "its embedding_grad_bytes is 7, rank0.json's 1024000")])
def test_a_tf_worker_recording_another_model_s_sizes_is_refused(tmp_path, capsys, edit, said):
    """Rank 1's row widths or lookups of TF's packed translator changed read silently (each rank sizes its collectives
    from its own file; the matched collectives took rank 0's: 101.18 ms either way): every worker runs one model."""
    run = copy_fixture(tmp_path, "tf/translator-pack")
    edit_json(run / "rank1.json", edit)
    line = _refused(capsys, "analyze", "--json", run)
    assert f"{run}/rank1.json: {said}: every worker runs the same model" in line, line


@pytest.mark.parametrize(("fixture", "rate", "said"), [
    ("powersgd-ctr/defaults", "20Mbit", "the link fitted to 144 collectives (60.9 MB) moved their bytes at 8.9 times that rate"),
    ("fsdp-fresh/dual-1x2-1gbit", "100Mbit", "the link fitted to 295 collectives (29.2 MB) moved their bytes at 11.9 times that rate")])
def test_a_profiled_bandwidth_far_below_what_the_collectives_moved_is_refused(capsys, fixture, rate, said):
    """``--profiled-bandwidth`` slower than the profile's collectives ran (the CTR ranker profiled at 200 Mbit/s said to
    be 20) scaled the whole fit by the rate ratio: 1 Gbit/s predicted 95 ms a step where the profile's own link gives
    375 (a note only). Fits run at most about twice the wire they were profiled on (TF's 200 %)."""
    line = _refused(capsys, "whatif", "--json", DATA / fixture, "--profiled-bandwidth", rate, "--bandwidth", "1Gbit", "--no-trace")
    assert f"--profiled-bandwidth {rate}: {said}, which no wire allows" in line, line
    rc, doc, err = cli_json(capsys, "whatif", "--json", str(DATA / fixture), "--profiled-bandwidth", "200Mbit" if "ctr" in fixture else "1Gbit",
                            "--bandwidth", "1Gbit", "--no-trace")
    assert rc == 0, err  # the rate each ran at: answered
