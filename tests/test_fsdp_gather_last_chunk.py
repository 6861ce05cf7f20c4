"""A slower link what-if from an FSDP profile whose wire is known (``--profiled-bandwidth``) delays each all-gather's
later rank out by at least its last chunk's added wire time (``passes.comm._gathers_last_chunk``; issue 16).

gloo's all-gather sends a rank's shard in two chunks, each once the peer's recv-ready came, and that recv-ready follows
the peer's own chunk on the connection: the rank that joined last leaves a chunk's wire time after the first. At 1 Gbit/s
the testbed port's burst (125 kB) hid that chunk, so the later rank's lag measured ~0.1 ms, and scaled by the rate ratio it
stayed a fraction of the chunk's time at 200 Mbit/s. ``fsdp-fresh/dual-1x2-1gbit``: the HSDP dual encoder, 1x2, 1 Gbit/s."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

from dagprof.passes.comm import exit_lags
from dagprof.passes.link_fit import priced_comm
from dagprof.pipeline import open_run
from dagprof.search.scenario import Cluster, Scenario, apply, base_topology, profiled_at
from dagprof.traces.events import CommKind

RUN = DATA / "fsdp-fresh" / "dual-1x2-1gbit"


def lag_growth(bandwidth: str, cluster: Cluster) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per (collective, consumer) pair: the consumer's gap grown by the what-if against the same graph at the profiled
    rate, the rank's exit lag as profiled, the collective's kind, and its gathered bytes."""
    g = profiled_at(open_run(RUN).graph, cluster)
    topo = base_topology(g, cluster)
    same, out = (apply(g, Scenario(bandwidth=b), cluster, topo) for b in ("1Gbit", bandwidth))
    pairs, lag = exit_lags(same, np.flatnonzero(priced_comm(g)))
    return out.gap[pairs[:, 1]] - same.gap[pairs[:, 1]], lag, g.comm_kind[pairs[:, 0]], g.nbytes[pairs[:, 0]]


def test_a_slower_link_delays_a_gathers_later_rank_by_its_last_chunk():
    grow, lag, kind, nbytes = lag_growth("200Mbit", Cluster(profiled_bandwidth="1Gbit"))
    later = (kind == CommKind.ALL_GATHER) & (lag > 0)
    assert later.sum() >= 100 and np.median(lag[later]) < 150  # the burst hid the chunk: ~0.1 ms lags at 1 Gbit/s
    chunk_us = nbytes[later] / 4 * (8 / 200 - 8 / 1000)  # half a rank's shard of 2, its time at 200 Mbit/s less at 1 Gbit/s
    assert (grow[later] >= chunk_us - 1.0).all()  # before: lag x 4, 0.4 ms at the median against 1.8 for a 56 kB chunk
    first = (kind == CommKind.ALL_GATHER) & (lag == 0)
    assert np.abs(grow[first]).max() == pytest.approx(0.0, abs=1e-6)  # the first rank out keeps its gap
    rs = (kind == CommKind.REDUCE_SCATTER) & (lag > 0)
    assert (grow[rs] <= 4 * lag[rs] + 1e-6).all()  # the reduce-scatters' lags: the rate ratio, as before


def test_a_faster_link_or_an_unknown_wire_keeps_the_rate_ratio():
    grow, lag, kind, _ = lag_growth("2Gbit", Cluster(profiled_bandwidth="1Gbit"))
    later = (kind == CommKind.ALL_GATHER) & (lag > 0)
    assert (grow[later] <= 1e-6).all() and (grow[later] >= -lag[later] - 1e-6).all()  # shrinks, by no more than the lag
    grow, lag, kind, nbytes = lag_growth("200Mbit", Cluster())
    later = (kind == CommKind.ALL_GATHER) & (lag > 0)
    assert (grow[later] < nbytes[later] / 4 * (8 / 200 - 8 / 1000) - 1.0).any()  # no wire known: no chunk floor
