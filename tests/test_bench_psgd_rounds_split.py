"""``bench/bench_psgd_rounds_split.py`` on a vendored PowerSGD strategy run (``tests/data/overlap-control``: the held-out
embedding's round 0, 1 bucket after the backward): each bucket's chain cut at its records' marks, part by part."""
from __future__ import annotations

import json
import os
import statistics
import sys

import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from bench_psgd_rounds_split import SKIP, chains, split_run  # noqa: E402

RUN = os.path.join(DATA, "overlap-control", "w0-2", "lossy", "verify", "round0-B", "run")


def _docs() -> list[dict]:
    return [json.load(open(os.path.join(RUN, f"rank{r}.json"))) for r in (0, 1)]


def test_every_chain_is_its_hook_then_three_issues_then_done():
    for doc in _docs():
        got = chains(doc)
        assert sorted(s for s, _ in got) == doc["steps_profiled"] and {b for _, b in got} == {0}
        for m in got.values():
            assert m["begin"] <= m["unc"] <= m["p"] <= m["q"] <= m["done"]  # the uncompressed all-reduce first, then P, then Q


def test_the_parts_add_up_to_each_chain_and_the_recordings_medians():
    docs = _docs()
    split = split_run(RUN)
    kept = [len([s for s, _ in chains(d) if s >= d["steps_profiled"][0] + SKIP]) for d in docs]
    assert len(split["b0.chain"]) == sum(kept) == 22
    for k in range(22):
        parts = sum(split[f"b0.{p}"][k] for p in ("hook", "unc", "p", "q"))
        assert parts == pytest.approx(split["b0.chain"][k], abs=1e-9)
        assert all(split[f"b0.lag_{p}"][k] >= 0 for p in ("unc", "p", "q"))
    med = {p: statistics.median(split[f"b0.{p}"]) for p in ("hook", "unc", "p", "q", "chain")}
    # the fixed recording's figures: the uncompressed all-reduce (6.4 kB) 2.18 ms issue to P's issue, P (141.8 kB) 6.60, Q 2.57
    assert med == pytest.approx({"hook": 2.24, "unc": 2.18, "p": 6.60, "q": 2.57, "chain": 16.83}, abs=0.01)
    assert sum(split["b0.inline"]) == 0 and statistics.median(split["train.wait"]) < 0.05 * statistics.median(split["train.cpu"])
