"""A reviewer's damages (``bench/damage_58.py`` sweeps them over every reader), one check per fix.

Each was answered before with exit 0 and a wrong number or an unclear failure. Every copy is made in the test from a
vendored fixture; nothing under tests/data changes.
"""
from __future__ import annotations

import json

from testdata import copy_fixture, edit_json

from dagprof.cli.main import main

SEC_NS = 1_000_000_000


def _cli(capsys, *argv) -> tuple[int, dict | None, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    try:
        return rc, json.loads(out.strip().splitlines()[-1]), err
    except (ValueError, IndexError):
        return rc, None, err


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
    rc, clean, _ = _cli(capsys, "analyze", "--json", str(run))
    assert rc == 0
    edit_json(run / "rank1.json", lambda d: _shift(d, 3 * SEC_NS))
    rc, doc, err = _cli(capsys, "analyze", "--json", str(run))
    assert rc == 0, err
    assert doc["predicted_iter_ms"] == clean["predicted_iter_ms"]
    assert doc["measured_iter_ms"] == clean["measured_iter_ms"]
    assert not any("renumbered" in w for w in doc["warnings"]), doc["warnings"]
    assert abs(doc["clock_alignment"]["offset_us"]["1"] + 3e6) < 1e4
