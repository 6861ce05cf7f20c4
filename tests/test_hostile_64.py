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
        assert f"{run / 'rank1.json'}: its DDP was built by DistributedDataParallel, rank0.json's by the composable " \
               "replicate() (ddp_api)" in line, line
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

