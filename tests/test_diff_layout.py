"""``diff`` names the data-parallel setting two profiles differ in (DDP buckets, FSDP units, mesh, reshard, dtypes,
prefetch), on real recordings whose settings are known from how they were recorded (tests/data/README.md)."""
from __future__ import annotations

import json
import os

import pytest

from dagprof.analysis.diff import diff_profiles
from dagprof.cli.main import main
from dagprof.pipeline import open_run

DATA = os.path.join(os.path.dirname(__file__), "data")


def _notes(a: str, b: str) -> list[str]:
    return diff_profiles(open_run(os.path.join(DATA, a)), open_run(os.path.join(DATA, b))).notes


def _layout_notes(a: str, b: str) -> list[str]:
    return [n for n in _notes(a, b) if not n.startswith("ops without a counterpart")]


def test_reshard_dtype_and_prefetch_each_named():
    """``keep-bf16-prefetch`` is ``reshard``'s job with --no-reshard --bf16 --prefetch 1: three settings, three lines."""
    assert _layout_notes("fsdp/reshard", "fsdp/keep-bf16-prefetch") == [
        "FSDP units kept gathered after forward differ: B only <root>, blocks.0, blocks.1",
        "FSDP all-gather dtype differs: A float32, B bfloat16",
        "FSDP all-gathers prefetched per step differ: A 2, B 1",
    ]


def test_units_grouped_in_pairs_named_as_the_user_grouped_them():
    notes = _layout_notes("fsdp/reshard4", "fsdp/pairs4")
    assert notes[0] == ("FSDP units differ: A has 5 (<root>, blocks.0, blocks.1, blocks.2, blocks.3), "
                        "B 3 (<root>, [blocks.0, blocks.1], [blocks.2, blocks.3])")


def test_hsdp_layouts_differ_in_mesh_only():
    """One job on 6 ranks as 2x3 and 3x2: the mesh differs; prefetch is counted per shard group, so it does not."""
    assert _layout_notes("fsdp/hsdp-2x3", "fsdp/hsdp-3x2") == ["FSDP mesh differs: A 2x3 (replicate x shard), B 3x2 (replicate x shard)"]


def test_ddp_against_fsdp_says_which_is_which(capsys):
    """Not "gradient buckets differ: A has 0 per step": the two runs are different kinds of data parallelism."""
    a, b = os.path.join(DATA, "lora", "fsdp-0"), os.path.join(DATA, "lora", "ddp-0")
    assert main(["diff", a, b, "--json", "--no-report"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["notes"][0] == "data parallelism differs: A is FSDP (3 units on a mesh of 2), B DDP (2 gradient buckets a step: 1.00 MB, 77.0 KB)"
    assert out["a"]["data_parallel"]["kind"] == "fsdp" and out["a"]["data_parallel"]["mesh"] == [2]
    assert out["b"]["data_parallel"] == {"kind": "ddp", "bucket_bytes": out["b"]["bucket_bytes"]} and len(out["b"]["bucket_bytes"]) == 2


@pytest.mark.parametrize("run", ["fsdp/reshard", "lora/ddp-0"])
def test_a_profile_against_itself_has_no_layout_note(run):
    assert _layout_notes(run, run) == []


def test_kept_gathered_names_the_units_that_changed_apart_from_those_both_kept():
    """A job of 7 units whose encoder blocks were switched: the 4 switched units, then the 3 alike, not two lists in a row."""
    from dagprof.analysis.diff.layout import DataParallelLayout, layout_notes

    a = DataParallelLayout("fsdp", units=("<root>", "enc.0", "enc.1", "dec.0"), mesh=(2,), kept_after_forward=("<root>", "dec.0", "x"))
    b = DataParallelLayout("fsdp", units=a.units, mesh=(2,), kept_after_forward=("<root>", "enc.0", "enc.1", "dec.0"))
    assert layout_notes(a, b, ("A", "B")) == [
        "FSDP units kept gathered after forward differ: A only x; B only enc.0, enc.1; both <root>, dec.0"]
