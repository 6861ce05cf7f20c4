"""A Horovod profile's stalled transfers (``passes.comm._horovod_stalls``): each keeps its time beyond the link fitted to
the others on itself, not spread over every transfer as latency, and a slower wire hides it as far as it takes longer.
On hvd_sparse_gru profiled at 500 Mbit/s on the testbed (tests/data/horovod/testbed-sparse-gru/500M: one 5.12 MB
all-reduce took 230 ms beyond the fitted link, several small ones 8-96 ms)."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

from dagprof.passes import set_link, set_topology
from dagprof.passes.link_fit import link_fit, profiled_comm
from dagprof.pipeline import open_run
from dagprof.search.scenario import Cluster, base_topology, profiled_at

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
    for c in comm[stall > 0].tolist():
        wire = np.median(slow.dur[comm[(stall == 0) & (g.nbytes[comm] == g.nbytes[c])]]) if (g.nbytes[comm[stall == 0]] == g.nbytes[c]).any() else None
        if wire is not None:
            assert slow.dur[c] == pytest.approx(max(wire, g.dur[c]), rel=1e-6)
    assert (slow.dur[comm] >= model.dur[comm] - 1e-6).all()  # no transfer gets faster on a slower wire
