"""A script's own async collectives queued on their group (``passes.comm.queued_own``): a rank's lag behind the first
rank out of one is no wire time a link what-if stretches, since the next transfer already follows it on the link. On
real recordings: the DP x TP ViT's per-parameter all-reduces issued at once after ``backward()``
(``tp-fresh/vit-tp-api-sized``), and a stock DDP job's Kineto trace (``gloo-windows/same``), which no rule reads so."""
from __future__ import annotations

import numpy as np
from testdata import DATA

from dagprof.graph.build import build_graph
from dagprof.passes import set_link
from dagprof.passes.comm import exit_lags, retime_collectives
from dagprof.passes.link_fit import find_collectives, link_fit, priced_comm, queued_own, service_fitted
from dagprof.pipeline import open_run
from dagprof.traces.dagprof_run import read_run


def test_the_vits_all_reduces_issued_at_once_queue_but_the_last():
    g = build_graph(read_run(DATA / "tp-fresh" / "vit-tp-api-sized"))
    dp = np.flatnonzero(priced_comm(g))
    queued = queued_own(g)
    assert len(dp) == 48 and queued[dp].sum() == 46  # 24 a step in each of the 2 DP groups, the last of each not queued
    assert not queued[np.setdiff1d(np.arange(len(g)), dp)].any()  # the TP all-reduces inside the ops are no priced collective


def test_a_slower_link_leaves_a_queued_ranks_lag_as_measured():
    g = build_graph(read_run(DATA / "tp-fresh" / "vit-tp-api-sized"))
    dp = np.flatnonzero(priced_comm(g))
    pairs, lag = exit_lags(g, dp)
    late, lag = pairs[lag > 0], lag[lag > 0]
    queued = queued_own(g)[late[:, 0]]
    grew = set_link(g, bandwidth=20e6).gap[late[:, 1]] - g.gap[late[:, 1]]  # a 15th of the loopback fit's time per byte
    assert queued.sum() > 40 and np.ptp(lag[queued]) > 10.0  # us: lags of every size, from a few us to tens
    assert np.ptp(grew[queued]) < 0.01 and grew[queued].max() < 5.0  # none stretched with its lag: as measured


def test_the_queues_link_is_its_service_times_line_and_each_keeps_its_own_time():
    """Profiled on loopback (no wire known), the queue's service times fit a line (mostly latency: 40 B-128 KB took about
    alike), and each instance keeps its time beside it: priced on that line, every collective takes what it measured."""
    g = build_graph(read_run(DATA / "tp-fresh" / "vit-tp-api-sized"))
    dp = np.flatnonzero(priced_comm(g))
    fit = link_fit(g)
    assert service_fitted(g) and fit.service and fit.collectives == 48 and fit.link.alpha_us > 0
    assert np.allclose(retime_collectives(g).dur[dp], g.dur[dp])
    assert not service_fitted(g.replace(meta=g.meta.replace(wire_bytes_per_s=125e6)))  # a known wire: split_at_wire's


def test_a_kineto_traces_collectives_are_not_read_as_the_scripts_own():
    """A Kineto trace does not say whether DDP issued its collectives (this one's buffer broadcasts and buckets)."""
    g = open_run(DATA / "gloo-windows" / "same").graph
    assert len(find_collectives(g)) and not queued_own(g).any()
