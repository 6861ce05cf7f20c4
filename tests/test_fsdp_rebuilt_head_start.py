"""A what-if that rebuilds an FSDP job's collectives (``--workers``, ``--mesh``) from a profile whose wire is known
(``--profiled-bandwidth``) carries each floored kind's per-instance head start (``passes.comm.carried_own_time``), and
``whatif`` says that those kinds are floored rather than scaled by the rate ratio (issue 16).

``fsdp-fresh/dual-1x2-1gbit`` (the HSDP dual encoder, 1x2, 1 Gbit/s, hooks only): both its kinds beat the wire and are
floored at it (``test_fsdp_wire_floor.py``). Before, ``--workers 2`` (its own layout, re-priced by ``scale_workers``)
came out 244 ms against its model's 236, and ``--workers 4`` (2x2) 264 against 256 without the wire."""
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


def medians(scenarios: list[Scenario], c: Cluster) -> list[float]:
    rows = evaluate(open_run(RUN).graph, scenarios, c, tolerance_pct=None)["scenarios"]
    return [r.to_json()["predicted_median_ms"] for r in rows]


def test_the_profiled_layout_rebuilt_is_its_model():
    model, workers, mesh = medians([Scenario(), Scenario(workers=2), Scenario(mesh=(1, 2))], WIRE)
    assert workers == pytest.approx(model, rel=1e-6)  # before: +3.5 %, every head start lost
    assert mesh == pytest.approx(model, rel=1e-6)


def test_more_replicas_keep_the_shard_groups_head_starts():
    g = profiled_at(open_run(RUN).graph, WIRE)
    own = carried_own_time(g)
    idx = np.flatnonzero(priced_comm(g))
    gathers = idx[(g.comm_kind[idx] == CommKind.ALL_GATHER) & (g.nbytes[idx] == 223680)]  # a block's bf16 gathers
    assert np.median(own[gathers]) < -300  # each beat the wire's 895 us by more than 300
    out = apply(g, Scenario(workers=4), WIRE, base_topology(g, WIRE))
    new = np.flatnonzero(priced_comm(out))
    blocks = new[(out.comm_kind[new] == CommKind.ALL_GATHER) & (out.nbytes[new] == 223680)]
    priced = model_prices(out, blocks, out.meta.topology, out.meta.scheme)
    assert np.median(out.dur[blocks] - priced) < -300  # before: 0, each at the wire's price
    with_wire, without = medians([Scenario(workers=4)], WIRE)[0], medians([Scenario(workers=4)], Cluster())[0]
    assert with_wire == pytest.approx(without, rel=0.01)  # before: +3.1 % over it


def test_whatif_says_the_floored_kinds_are_priced_at_the_wire():
    notes = evaluate(open_run(RUN).graph, [Scenario(bandwidth="200Mbit")], WIRE, tolerance_pct=None)["notes"]
    said = next(n for n in notes if n.startswith("--profiled-bandwidth 1Gbit"))
    assert "all-gathers and reduce-scatters ran faster than the wire" in said
    assert "scales by the rate ratio" not in said  # before: said so, of a job whose kinds the wire floors
