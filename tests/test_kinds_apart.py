"""Which graphs' collectives cost on their own kind's link (``passes.comm.kinds_apart``): wherever the graph's own link fit
produced per-kind links, decided when it is first priced and carried from then, and an FSDP job's always (a calibration's
per-kind links price it). A topology with per-kind links (as a ``dagprof calibrate`` file gives) prices no other graph's
collectives per kind: a DDP job's sparse all-gathers stay all-reduces of their cost, however often re-priced."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from testdata import DATA

from dagprof.costmodel.alphabeta import AlphaBeta
from dagprof.passes import scale_workers, set_link, set_topology
from dagprof.passes.comm import current_topology, kinds_apart
from dagprof.passes.link_fit import fit_topology, priced_comm
from dagprof.pipeline import open_run
from dagprof.traces.events import CommKind


def _graph(run: str):
    return open_run(DATA / run, template=True).graph


def _gathers(g) -> np.ndarray:
    return np.flatnonzero(priced_comm(g) & (g.comm_kind == CommKind.ALL_GATHER) & (g.nbytes > 0))


def _slow_gathers(g):
    """The graph's fitted topology with an all-gather link ten times slower than its all-reduce one."""
    t = current_topology(g)
    return t, replace(t, kinds=(*((k, ab) for k, ab in t.kinds if k != "all_gather"), ("all_gather", AlphaBeta(0.0, 10 * max(t.inter.beta_us_per_byte, 1e-4)))))


def test_the_graphs_own_fit_decides_and_pricing_carries_it():
    for run, apart in [("tf-jax/zero-rs-1g", True), ("tf-jax/fsdp-conv", False), ("ddp-fresh/sparse", False), ("fsdp/testbed-1gbit", True)]:
        g = _graph(run)
        assert kinds_apart(g, fit_topology(g)) is apart, run
        h = set_link(g, bandwidth=current_topology(g).inter.bandwidth_bytes_per_s / 5)
        assert h.meta.kinds_apart is apart, run
        assert scale_workers(h, 1).meta.kinds_apart is apart and scale_workers(g, 4).meta.kinds_apart is apart, run


def test_a_ddp_jobs_sparse_gathers_ignore_a_topologys_per_kind_links():
    g = _graph("ddp-fresh/sparse")
    assert len(_gathers(g))
    t, slow = _slow_gathers(g)
    a, b = set_topology(g, t), set_topology(g, slow)
    assert np.array_equal(a.dur, b.dur) and not b.meta.kinds_apart
    bw = t.inter.bandwidth_bytes_per_s / 2
    assert np.array_equal(set_link(a, bandwidth=bw).dur, set_link(b, bandwidth=bw).dur)  # re-priced: still as all-reduces


def test_per_kind_links_price_the_gathers_of_a_graph_fitted_per_kind_and_of_fsdp():
    for run in ("tf-jax/zero-rs-1g", "fsdp/reshard"):  # fsdp/reshard: its own fit gives no per-kind link, a calibration's prices it
        g = _graph(run)
        gathers = _gathers(g)
        assert len(gathers), run
        t, slow = _slow_gathers(g)
        a, b = set_topology(g, t), set_topology(g, slow)
        assert b.meta.kinds_apart and np.all(b.dur[gathers] > a.dur[gathers]), run
        others = np.setdiff1d(np.flatnonzero(priced_comm(g)), gathers)
        assert np.array_equal(a.dur[others], b.dur[others]), run
