"""``bench/fsdp_fresh/pair_units.py`` on the vendored LoRA pair (``tests/data/lora``): each unit's timeline and each kind's
lags, in the FSDP profile and in its DDP profile's conversion, keep FSDP2's order (no timing)."""
from __future__ import annotations

import math
import os
import sys

import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "fsdp_fresh"))

import pair_units  # noqa: E402

from dagprof.pipeline import open_run  # noqa: E402


@pytest.fixture(scope="module")
def both():
    return {"fsdp": open_run(DATA / "lora" / "fsdp-0").graph, "conv": pair_units.converted(open_run(DATA / "lora" / "ddp-0").graph)}


@pytest.mark.parametrize("which", ["fsdp", "conv"])
def test_each_unit_gathers_before_its_forward_and_scatters_after_its_backward(both, which):
    t = pair_units.units(both[which])
    inner = [u for u in t if u not in ("*", "<root>")]
    assert inner and "<root>" in t
    for u in [*inner, "<root>"]:
        row = t[u]
        assert row["agf0"] <= row["agf1"] <= row["fwd0"] + 1e-6, u
        assert row["bwd1"] <= row["rs0"] + 1e-6 and row["rslag"] >= -1e-6, u
    assert t["*"]["opt0"] >= max(t[u]["rs1"] for u in t if "rs1" in t[u]) - 1e-6  # the optimizer after every reduce-scatter
    assert t["*"]["step"] >= t["*"]["opt1"]


@pytest.mark.parametrize("which", ["fsdp", "conv"])
def test_each_kind_is_blocked_at_least_from_the_later_issue_to_its_wake(both, which):
    k = pair_units.kinds(both[which])
    assert set(k) == {"all_gather", "reduce_scatter"}
    for row in k.values():
        assert row["calls"] > 0 and row["transfer"] > 0
        assert not math.isnan(row["last_in"]) and row["blocked"] >= row["last_in"] - 1e-6 >= row["transfer"] - 1e-3
        assert row["lag"] >= 0 and row["last_lag"] >= 0


def test_the_last_reduce_scatter_is_the_one_the_final_callback_issues(both):
    """The LoRA's first block (its embedding frozen) is reduce-scattered after the root, from FSDP2's final backward
    callback; its wait lagged longer than the others' in this recording too."""
    k = pair_units.kinds(both["fsdp"])["reduce_scatter"]
    assert k["last_lag"] > k["lag"]


def test_totals_sum_the_units(both):
    t = pair_units.units(both["fsdp"])
    x = pair_units.totals(t)
    assert x["rs"] == pytest.approx(sum(t[u].get("rsdur", 0) for u in t if u != "*"))
    assert 0 < x["fwdend"] < x["step"] and x["opt"] > 0
