"""A script's own async collectives queued on their group (``passes.comm.queued_own``): a rank's lag behind the first
rank out of one is no wire time a link what-if stretches, since the next transfer already follows it on the link. On
real recordings: the DP x TP ViT's per-parameter all-reduces issued at once after ``backward()``
(``tp-fresh/vit-tp-api-sized``), and a stock DDP job's Kineto trace (``gloo-windows/same``), which no rule reads so."""
from __future__ import annotations

import numpy as np
from testdata import DATA

from dagprof.graph.build import build_graph
from dagprof.passes import set_link
from dagprof.passes.comm import exit_lags, queued_own
from dagprof.passes.link_fit import find_collectives, priced_comm
from dagprof.pipeline import open_run
from dagprof.traces.dagprof_run import read_run


def test_the_vits_all_reduces_issued_at_once_queue_but_the_last():
    g = build_graph(read_run(DATA / "tp-fresh" / "vit-tp-api-sized"))
    dp = np.flatnonzero(priced_comm(g))
    queued = queued_own(g)
    assert len(dp) == 48 and queued[dp].sum() == 46  # 24 a step in each of the 2 DP groups, the last of each not queued
    assert not queued[np.setdiff1d(np.arange(len(g)), dp)].any()  # the TP all-reduces inside the ops are no priced collective


def test_a_slower_link_leaves_a_queued_ranks_lag_and_scales_the_last_ones():
    g = build_graph(read_run(DATA / "tp-fresh" / "vit-tp-api-sized"))
    dp = np.flatnonzero(priced_comm(g))
    pairs, lag = exit_lags(g, dp)
    late = pairs[lag > 0]
    slow = set_link(g, bandwidth=20e6)  # the loopback profile's fit runs at about 200 Mbit/s
    queued = queued_own(g)[late[:, 0]]
    assert queued.any() and (~queued).any()
    grew = slow.gap[late[:, 1]] - g.gap[late[:, 1]]
    # us: as measured, but where the node also waits for a last (unqueued) collective: that one's wire, its 40 B at the new
    # rate (2 us; from the loopback's wire beside its per-call cost, ``passes.comm.own_call_link``)
    assert lag[lag > 0][queued].sum() > 1000 and np.abs(grew[queued]).max() < 5.0
    assert (grew[~queued] > 0).all()  # the last one's lag, wire time, stretched


def test_a_kineto_traces_collectives_are_not_read_as_the_scripts_own():
    """A Kineto trace does not say whether DDP issued its collectives (this one's buffer broadcasts and buckets)."""
    g = open_run(DATA / "gloo-windows" / "same").graph
    assert len(find_collectives(g)) and not queued_own(g).any()
