"""A Horovod profile's stalled transfers (``passes.comm._horovod_stalls``): each keeps its time beyond the link fitted to
the others on itself, not spread over every transfer as latency, and a slower wire hides it as far as it takes longer.
On hvd_sparse_gru profiled at 500 Mbit/s on the testbed (tests/data/horovod/testbed-sparse-gru/500M: one 5.12 MB
all-reduce took 230 ms beyond the fitted link, several small ones 8-96 ms)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis.interval import step_times
from dagprof.costmodel.collectives import allreduce_us
from dagprof.costmodel.topology import CollectiveSpec
from dagprof.passes import set_link, set_topology
from dagprof.passes.link_fit import link_fit, profiled_comm
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.search.scenario import Cluster, base_topology, profiled_at
from dagprof.traces.events import CommKind

RUN = DATA / "horovod" / "testbed-sparse-gru" / "500M"


def _priced():
    g = open_run(RUN).graph
    c = Cluster(profiled_bandwidth="237.5Mbit")  # the model's link of 2 ranks on a 500 Mbit/s loopback (rate x 0.95 / 2)
    marked = profiled_at(g, c)
    return g, marked, set_topology(marked, base_topology(marked, c))


def test_stalls_stay_on_their_own_transfers_at_the_profiled_rate():
    g, marked, model = _priced()
    fit = link_fit(marked)
    assert fit.stalls is not None and fit.stalls.max() > 200e3  # the 5.12 MB transfer's
    comm = profiled_comm(marked)
    stalled = comm[fit.stalls > 0]
    assert np.array_equal(np.round(model.dur[stalled], 6), np.round(g.dur[stalled], 6))  # each as measured
    small = comm[(fit.stalls == 0) & (g.nbytes[comm] < 100_000)]
    assert np.median(model.dur[small]) < 2e3  # on the fit alone (the stalls spread as latency: 11.9 ms, measured 0.1-6.8)
    assert model.dur[comm].sum() == pytest.approx(g.dur[comm].sum(), rel=0.03)


def test_a_slower_wire_hides_a_stall_as_far_as_it_takes_longer():
    """At 200 Mbit/s a stalled transfer takes the longer of the wire's price for its size and its measured time (its stall
    behind the time the wire adds): the 5.12 MB one's 406 ms under the wire's 431, a 694 kB one's 120 ms over its 58."""
    g, marked, model = _priced()
    slow = set_link(model, 95e6 / 8)  # 200 Mbit/s, as the model's link
    comm = profiled_comm(marked)
    stall = link_fit(marked).stalls
    bare = replace(slow.meta.topology, floor=None, floor_wire=None)  # the wire alone (the fit is the floor: ``split_at_wire``)
    checked = 0
    for c in comm[stall > 0].tolist():
        if CommKind(int(g.comm_kind[c])) is CommKind.ALL_REDUCE and g.nbytes[c] > 500_000:
            wire = allreduce_us(float(g.nbytes[c]), bare, CollectiveSpec())
            assert slow.dur[c] == pytest.approx(max(wire, g.dur[c]), rel=1e-6)
            checked += 1
    assert checked >= 2
    assert (slow.dur[comm] >= model.dur[comm] - 1e-6).all()  # no transfer gets faster on a slower wire


def test_the_model_keeps_each_steps_collectives():
    """The model the what-ifs start from keeps each transfer's own time (its floor, not the fit's line): every step of the
    profiled run replays as measured, so its median step too (before: -0.6 % on this fp16 autoencoder profiled at 500 Mbit/s,
    -7.5 % on a fresh two-host round's, their mean steps within 0.2 %)."""
    g = open_run(DATA / "horovod" / "testbed-autoencoder").graph
    c = Cluster(profiled_bandwidth="237.5Mbit")
    marked = profiled_at(g, c)
    model = set_topology(marked, base_topology(marked, c))
    comm = profiled_comm(marked)
    assert link_fit(marked).stalls is not None  # the fit's line, stalls apart, prices its transfers otherwise
    np.testing.assert_allclose(model.dur[comm], g.dur[comm], rtol=1e-9)
    np.testing.assert_allclose(step_times(model, replay(model)), step_times(g, replay(g)), rtol=1e-6)
