"""A script's own queued async collectives priced as the wire beside their per-call cost (``passes.comm.own_call_link``):
each takes the longer of the two, what it took beyond that stays its own, so the profiled link reproduces every
instance and a link what-if moves only the collectives whose wire outlasts the call. On the DP x TP ViT's recording
(``tp-fresh/vit-tp-api-sized``: per-parameter all-reduces issued at once on gloo) and a stock DDP trace, which keeps its fit."""
from __future__ import annotations

import numpy as np
from testdata import DATA

from dagprof.graph.build import build_graph
from dagprof.passes import set_link
from dagprof.passes.comm import current_topology, own_call_cost
from dagprof.passes.link_fit import priced_comm, profiled_collectives
from dagprof.pipeline import open_run
from dagprof.traces.dagprof_run import read_run


def _vit():
    return build_graph(read_run(DATA / "tp-fresh" / "vit-tp-api-sized"))


def test_the_per_call_cost_is_the_smallest_calls_median_and_a_floor_beside_the_wire():
    g = _vit()
    nbytes, dur = profiled_collectives(g, overlapping=True)
    cost = own_call_cost(g)
    assert cost == np.median(dur[nbytes == nbytes.min()]) and cost > 0
    t = current_topology(g)
    assert t.overhead_us == 0 and t.floor is not None and t.floor.overhead_us == cost
    assert t.floor.inter.beta_us_per_byte == 0 and t.floor_wire.overhead_us == 0  # the floor is the call alone


def test_the_profiled_link_keeps_every_instance_and_a_slower_one_moves_the_large_ones_only():
    g = _vit()
    dp = np.flatnonzero(priced_comm(g))
    same = set_link(g, latency_us=current_topology(g).inter.alpha_us)
    assert np.allclose(same.dur[dp], g.dur[dp])  # each instance's own time beside its price
    rate = 200e6 / 8
    slow = set_link(g, bandwidth=rate)
    grew = slow.dur[dp] - g.dur[dp]
    cost, beta = own_call_cost(g), current_topology(g).inter.beta_us_per_byte
    wire = g.nbytes[dp] * 1e6 / rate  # 2 ranks: a ring all-reduce's share of its bytes is 1
    hidden = wire <= cost
    assert hidden.any() and (~hidden).any()
    assert np.abs(grew[hidden]).max() < 1e-6  # the call outlasts the new wire: as measured
    expected = wire - np.maximum(cost, g.nbytes[dp] * beta)
    assert np.allclose(grew[~hidden], expected[~hidden])


def test_a_ddp_trace_keeps_its_fitted_link():
    g = open_run(DATA / "gloo-windows" / "same").graph
    assert own_call_cost(g) is None and current_topology(g).floor is None
