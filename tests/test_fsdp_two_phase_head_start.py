"""A slower link what-if from an FSDP profile whose wire is known (``--profiled-bandwidth``) shrinks each floored
reduce-scatter's head start by the rate ratio (gloo runs it as an all-reduce: two phases a port), and keeps each
all-gather's as time (``passes.comm._two_phase_head_starts``; issue 16).

``fsdp-fresh/dual-1x2-1gbit`` (the HSDP dual encoder, 1x2, 1 Gbit/s, hooks only): both its kinds are floored at the wire
(``test_fsdp_wire_floor.py``), its reduce-scatters 0.1-2.1 ms under it. Before, each kept that time at 200 Mbit/s."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

from dagprof.passes.comm import carried_own_time, model_prices
from dagprof.passes.link_fit import priced_comm
from dagprof.pipeline import open_run
from dagprof.search.scenario import Cluster, Scenario, apply, base_topology, profiled_at
from dagprof.search.whatif import evaluate
from dagprof.traces.events import CommKind

RUN = DATA / "fsdp-fresh" / "dual-1x2-1gbit"
WIRE = Cluster(profiled_bandwidth="1Gbit")


def own_after(bandwidth: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the profile's time beside each priced collective's price, that time after the what-if, the kinds)."""
    g = profiled_at(open_run(RUN).graph, WIRE)
    idx = np.flatnonzero(priced_comm(g))
    out = apply(g, Scenario(bandwidth=bandwidth), WIRE, base_topology(g, WIRE))
    return carried_own_time(g)[idx], out.dur[idx] - model_prices(out, idx, out.meta.topology, out.meta.scheme), g.comm_kind[idx]


def test_a_slower_link_shrinks_the_reduce_scatters_head_starts_by_the_rate():
    before, after, kind = own_after("200Mbit")
    rs = (kind == CommKind.REDUCE_SCATTER) & (before < 0)
    assert rs.sum() >= 30 and before[rs].min() < -2000  # the root's 1.6 MB beat the wire by 2.1 ms
    assert after[rs] == pytest.approx(before[rs] * 0.2, abs=1.0)  # before: as measured, -0.1 to -2.1 ms at 200 Mbit/s
    ag = kind == CommKind.ALL_GATHER
    assert after[ag] == pytest.approx(before[ag], abs=1.0)  # one phase: kept as time


def test_a_faster_link_keeps_the_reduce_scatters_head_starts():
    before, after, kind = own_after("2Gbit")
    rs = kind == CommKind.REDUCE_SCATTER
    assert after[rs] == pytest.approx(before[rs], abs=1.0)


def test_the_200mbit_step_takes_the_lost_head_starts():
    scenarios = evaluate(open_run(RUN).graph, [Scenario(), Scenario(bandwidth="200Mbit")], WIRE, tolerance_pct=None)["scenarios"]
    rows = [r.to_json()["predicted_median_ms"] for r in scenarios]
    assert rows[0] == pytest.approx(236.21, abs=0.05)  # the model of the profiled run, unchanged
    # was 440.1, then 443.2 with these head starts; 467.6 since each all-gather's later rank waits its last chunk
    # (test_fsdp_gather_last_chunk.py); the job measured 466.5 (test_fsdp_wire_floor.py)
    assert rows[1] == pytest.approx(467.6, abs=0.3)
