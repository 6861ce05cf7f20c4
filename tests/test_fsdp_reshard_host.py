"""``reshard_after_forward`` off removes each backward all-gather's host time, not only its transfer (``passes.fsdp``).

``tests/data/review6/convnext-on`` and ``convnext-off`` are one review script (``bench/review6/convnext_accum.py``: FSDP2,
bf16 parameters, 2 micro-batches a step) profiled as written and with ``--keep-gathered`` (``reshard_after_forward=False``).
"""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis import analyze
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import Passes, fsdp_collectives, issuers
from dagprof.passes.fsdp import gather_host_nodes, set_reshard
from dagprof.replay import replay
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind

ON, OFF = DATA / "review6" / "convnext-on", DATA / "review6" / "convnext-off"


def graph(path):
    return build_graph(read_run(path))


def backward_gathers(g):
    in_pass = Passes(g)
    return [c.node for c in fsdp_collectives(g) if c.kind.label == "all_gather" and not in_pass.is_forward(c.node, min(issuers(g, c.node)))]


def host_time(g, gathers):
    """Every rank's time in the nodes of ``gathers`` (enqueues, issuing path, exit lags), us."""
    total = 0.0
    for c in gathers:
        for r in issuers(g, c):
            issue, lagged = gather_host_nodes(g, c, r)
            total += float(g.dur[issue].sum() + g.gap[lagged].sum())
    return total


def test_the_kept_profile_gathers_nothing_in_backward():
    """What the what-if must reach: the same job with the parameters kept gathers in forward only."""
    assert graph(OFF).meta.fsdp.units and not backward_gathers(graph(OFF))


def test_reshard_off_drops_each_backward_gathers_enqueue_exit_lag_and_issuing_path():
    g = graph(ON)
    gathers = backward_gathers(g)
    assert len(gathers) == 2 * len(g.meta.fsdp.units) * len(g.meta.steps)  # 2 micro-batches: one each
    before = host_time(g, gathers)
    assert before > 0
    # the issuing path is FSDP's own: the ``other:`` time between the unit's copy-out (or the compute) and the enqueue
    for c in gathers:
        for r in issuers(g, c):
            issue, _ = gather_host_nodes(g, c, r)
            assert all(g.kind[v] in (Kind.COMM_ENQUEUE, Kind.OTHER) for v in issue)
            assert all(g.node_name(v).startswith(f"rank{r}.other:") for v in issue if g.kind[v] == Kind.OTHER)
    off = set_reshard(g, False)
    assert not backward_gathers(off)  # gone as in the kept profile, their host nodes with them
    removed = {v for c in gathers for r in issuers(g, c) for v in gather_host_nodes(g, c, r)[0]}
    assert len(off) < len(g) - len(gathers) - len(removed)  # and their joins, waits, backward copy-outs and forward reshards
    assert not any(" (backward)" in n and "copy-out" in n or "reshard" in n and " (forward)" in n for n in map(off.node_name, range(len(off))))

    def forward(h):
        return sorted((h.node_name(c.node), float(h.dur[c.node])) for c in fsdp_collectives(h) if c.kind.label == "all_gather")
    assert forward(off) == [x for x in forward(g) if x[0] not in {g.node_name(c) for c in gathers}]
    # the replay gains more than the transfers alone: the host time went too
    saved = analyze(g, replay(g)).predicted_us - analyze(off, replay(off)).predicted_us
    assert saved > 0.5 * float(g.dur[gathers].sum()) / len(g.meta.steps)


def test_reshard_on_charges_the_forward_gathers_host_time_to_each_backward_pass():
    """Kept, each unit was gathered once a step (the first micro-batch's forward); resharded, it is gathered before
    each of the step's 2 backward passes: each costs what the forward all-gather took on that rank."""
    g = graph(OFF)
    on = set_reshard(g, True)
    forward = [c.node for c in fsdp_collectives(g) if c.kind.label == "all_gather"]
    assert {Passes(g).of_collective(c, 0) for c in forward} == {(0, True)}
    cost = 0.0
    for c in forward:
        for r in issuers(g, c):
            issue, lagged = gather_host_nodes(g, c, r, path=False)
            copy = [v for v in np.flatnonzero(g.rank == r).tolist() if g.step[v] == g.step[c]
                    and g.node_name(v).endswith(f"fsdp copy-out {g.node_name(c).split(' ', 1)[1].rpartition('.')[0]} (forward)")]
            cost += float(g.dur[c] + g.dur[issue + copy].sum() + g.gap[lagged].sum())
    assert float(on.dur.sum() - g.dur.sum()) == pytest.approx(2 * cost)
