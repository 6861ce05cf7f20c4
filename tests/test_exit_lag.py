"""Exit lags: a collective releases its ranks one after another, and under a link what-if the later ranks' lag
scales with the link's time per byte (``passes.comm.exit_lags``). On real testbed recordings of one FSDP2 job
(tests/data/fsdp/testbed-1gbit, testbed-200mbit: 2 gloo ranks in network namespaces, tc tbf at 1 Gbit/s and 200 Mbit/s)."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis import job_iteration_us
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import fsdp_collectives
from dagprof.passes import set_link
from dagprof.passes.comm import SOCKET_BUFFER_BYTES, current_topology, exit_lags
from dagprof.passes.fsdp_mesh import scale_fsdp_workers
from dagprof.passes.link_fit import keep_stalls, priced_comm
from dagprof.pipeline import open_run
from dagprof.traces.dagprof_run import read_run

FAST, SLOW = DATA / "fsdp" / "testbed-1gbit", DATA / "fsdp" / "testbed-200mbit"


def all_gathers(g) -> np.ndarray:
    return np.array([c.node for c in fsdp_collectives(g) if c.kind.label == "all_gather"])


def late_gap(g, pairs: np.ndarray, lag: np.ndarray) -> float:
    """The summed overhead of the consumers on the ranks that left each collective after the first, us."""
    return float(g.gap[pairs[lag > 0, 1]].sum())


def test_an_all_gather_releases_its_second_rank_a_wire_time_later():
    """gloo's send completes once its bytes sit in the socket buffer: the first rank out leaves while the other
    still receives about 200 KB, 1.8 ms at 1 Gbit/s and 9.6 ms at 200 Mbit/s: the lag follows the rate."""
    lags = {}
    for path in (FAST, SLOW):
        g = build_graph(read_run(path))
        pairs, lag = exit_lags(g, all_gathers(g))
        assert (lag > 0).sum() == len(all_gathers(g))  # one rank after the other, every time
        assert set(lag[lag == 0].tolist()) == {0.0} and (lag == 0).sum() == len(all_gathers(g))
        lags[path] = float(np.median(lag[lag > 0]))
    assert 1000 < lags[FAST] < 3000 and 3 < lags[SLOW] / lags[FAST] < 8


def test_a_bandwidth_whatif_scales_the_later_ranks_lag_only():
    g = build_graph(read_run(FAST))
    idx = all_gathers(g)
    pairs, lag = exit_lags(g, idx)
    bw = current_topology(g).inter.bandwidth_bytes_per_s
    same = set_link(g, bandwidth=bw)
    kept = keep_stalls(g)  # the measured gaps, and each stalled collective's excess before its transfer
    assert np.array_equal(same.gap, kept.gap)
    slow = set_link(g, bandwidth=bw / 5)
    grew = slow.gap[pairs[:, 1]] - kept.gap[pairs[:, 1]]
    assert np.all(grew[lag == 0] == 0)  # the first rank out leaves when the transfer ends, whatever the link
    # the later rank's lag grows 5x, up to what the all-gathers of its size lag typically and a socket buffer's worth
    # on the profiled link (beyond: its scheduling)
    size = g.nbytes[pairs[:, 0]]  # all-gathers only here, so their size alone picks their kind's like
    typical = np.array([np.median(lag[(size == b) & (lag > 0)]) for b in size])
    buffer = SOCKET_BUFFER_BYTES * current_topology(g).for_kind("all_gather").inter.beta_us_per_byte  # a kind on its own fitted link
    assert (lag > buffer).any() and (np.minimum(lag, typical) < buffer).any()
    assert grew[lag > 0] == pytest.approx(4 * np.minimum(np.minimum(lag, typical), buffer)[lag > 0], rel=1e-9)
    every, every_lag = exit_lags(g, np.flatnonzero(priced_comm(g)))  # the reduce-scatters' later ranks too, nothing else
    assert set(np.flatnonzero(slow.gap != kept.gap).tolist()) == set(every[every_lag > 0, 1].tolist())


def test_the_lags_at_200mbit_predicted_from_the_1gbit_recording():
    """The later ranks' overhead after the all-gathers per step: 200 Mbit/s predicted from the 1 Gbit/s recording
    within 25 % of the 200 Mbit/s recording's; kept as measured at 1 Gbit/s (as before), about half of it."""
    fast, slow = build_graph(read_run(FAST)), build_graph(read_run(SLOW))
    measured = late_gap(slow, *exit_lags(slow, all_gathers(slow)))
    pairs, lag = exit_lags(fast, all_gathers(fast))
    predicted = set_link(fast, bandwidth=current_topology(fast).inter.bandwidth_bytes_per_s / 5)
    assert late_gap(predicted, pairs, lag) == pytest.approx(measured, rel=0.25)
    assert late_gap(fast, pairs, lag) < measured / 1.8


ALT_FAST, ALT_SLOW = DATA / "fsdp" / "testbed-alternating-1gbit", DATA / "fsdp" / "testbed-alternating-200mbit"


def averaged(path):
    return open_run(path, template=True).graph


def test_the_averaged_model_carries_the_lag_of_a_last_rank_that_alternates():
    """Each all-gather released rank 0 last in some steps and rank 1 in others: averaged, the ranks' lags cancel out,
    so the collective carries its last rank's lag (a buffer's worth, as measured) for a link change to scale on every rank."""
    g = averaged(ALT_FAST)
    assert not build_graph(read_run(ALT_FAST)).exit_lag.any()  # a measured graph keeps each rank's own lag
    idx = all_gathers(g)
    carried = g.exit_lag[idx]
    _, per_rank = exit_lags(g, idx)
    measured = build_graph(read_run(ALT_FAST))
    _, lag = exit_lags(measured, all_gathers(measured))
    assert np.all((carried > 0.8 * np.median(lag[lag > 0])) & (carried <= np.median(lag[lag > 0])))
    assert np.median(per_rank[per_rank > 0]) < np.median(carried) / 2  # what the per-rank lags of the averaged graph keep
    bw = current_topology(g).inter.bandwidth_bytes_per_s
    kept = keep_stalls(g)
    assert np.array_equal(set_link(g, bandwidth=bw).gap, kept.gap)  # at the profiled link nothing moves but the stalls kept
    slow = set_link(g, bandwidth=bw / 5)
    pairs, _ = exit_lags(g, idx)
    assert slow.gap[pairs[:, 1]] - kept.gap[pairs[:, 1]] == pytest.approx(4 * g.exit_lag[pairs[:, 0]], rel=1e-9)  # every rank
    assert slow.exit_lag[idx] == pytest.approx(5 * carried, rel=1e-12)  # what the slower link's lag is, for a further change
    fast = set_link(g, bandwidth=bw * 1000)  # on a faster link each rank sheds at most its own share: its wake-up stays
    shed = kept.gap[pairs[:, 1]] - fast.gap[pairs[:, 1]]
    assert np.all(shed <= g.exit_lag[pairs[:, 1]] + 1e-9) and np.all(fast.gap[pairs[:, 1]] > 0)
    assert np.all(g.exit_lag[pairs[:, 1]] <= g.exit_lag[pairs[:, 0]])  # no rank's share exceeds the last rank's lag
    one = scale_fsdp_workers(g, 1)  # one rank leaves after no other: as without the carried lags
    assert np.array_equal(set_link(one, bandwidth=bw / 5).gap, set_link(one.replace(exit_lag=np.zeros(len(one))), bandwidth=bw / 5).gap)


@pytest.mark.parametrize("fast, slow, error_pct", [(ALT_FAST, ALT_SLOW, 5.0), (FAST, SLOW, 16.0)])
def test_200mbit_predicted_from_the_averaged_1gbit_profile(fast, slow, error_pct):
    """The averaged 1 Gbit/s profile at a fifth of its link's rate against the 200 Mbit/s recording's iteration: -4.0 %
    on the pair whose last rank out alternates (-11.4 % without the carried lags); the first pair, recorded at load 4-4.7,
    +12.2 % (+10.8 % without: its ranks' own lags, a socket buffer's worth at most, are as long): its link fit
    (841 Mbit/s) absorbed scheduling stalls, and the slower link scales them too."""
    g = averaged(fast)
    measured = open_run(slow).analysis.measured_us
    bw = current_topology(g).inter.bandwidth_bytes_per_s

    def error(h) -> float:
        return 100 * (job_iteration_us(set_link(h, bandwidth=bw / 5)) - measured) / measured

    carried, per_rank = error(g), error(g.replace(exit_lag=np.zeros(len(g))))
    assert abs(carried) < error_pct and (abs(carried) < abs(per_rank) or fast != ALT_FAST)
    assert job_iteration_us(set_link(g, bandwidth=bw)) == job_iteration_us(set_link(g.replace(exit_lag=np.zeros(len(g))), bandwidth=bw))
