"""More ranks than cores (``passes.compute.share_cores``) on a real testbed recording of an FSDP2 job
(tests/data/fsdp/testbed-1gbit: 2 gloo ranks in network namespaces, tc tbf at 1 Gbit/s), predicted for 4 ranks
at 200 Mbit/s on 2 cores as ``bench/bench_fsdp.py --part 2`` does: a rank's exit lag behind a collective is wire
time, so it waits off the cores while the other ranks compute."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis import job_iteration_us
from dagprof.graph.dag import DeviceKind
from dagprof.passes import set_link
from dagprof.passes.comm import current_topology, exit_lags
from dagprof.passes.compute import share_cores, wire_in_gaps
from dagprof.passes.fsdp_mesh import scale_fsdp_workers
from dagprof.passes.link_fit import keep_stalls
from dagprof.pipeline import open_run
from dagprof.traces.events import Kind

FAST = DATA / "fsdp" / "testbed-1gbit"


@pytest.fixture(scope="module")
def four_ranks_slow():
    g = open_run(str(FAST), template=True).graph
    bw = current_topology(g).inter.bandwidth_bytes_per_s
    return scale_fsdp_workers(set_link(g, bandwidth=bw / 5), 4)


def test_the_exit_lags_wait_off_the_shared_cores(four_ranks_slow):
    g = four_ranks_slow
    pairs, lag = exit_lags(g, np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0)))
    wire = wire_in_gaps(g, pairs)
    assert np.all(wire >= lag - 1e-9) and np.all(wire <= g.gap[pairs[:, 1]])  # the lag behind the first rank out, and more
    assert (wire > 1000).sum() > len(wire) / 2  # at 200 Mbit/s most consumers wait milliseconds for their last bytes
    s = share_cores(g, 2)
    n = len(g)
    waits = np.arange(n, len(s))
    assert len(waits) == (wire > 0).sum()
    assert np.all(s.device[waits] == -1) and np.all(s.kind[waits] == Kind.COMM_WAIT)
    assert s.gap[waits].sum() == pytest.approx(wire.sum())
    assert s.gap.sum() == pytest.approx(g.gap.sum())  # moved, not added or dropped
    cores = [i for i, d in enumerate(s.devices) if d.kind == DeviceKind.COMPUTE and d.capacity == 2]
    assert len(cores) == 1 and np.all(s.device[pairs[:, 1]] == cores[0])  # the consumers themselves still on the cores
    for (comm, cons), w in zip(pairs, wire):  # collective -> wait -> consumer
        if w > 0:
            (wait,) = set(s.successors(int(comm)).tolist()) & set(s.predecessors(int(cons)).tolist()) - {int(cons)}
            assert s.gap[wait] == w


def test_core_sharing_costs_less_than_queueing_behind_the_wire(four_ranks_slow):
    """The step with 4 ranks on 2 cores: longer than with a core each, shorter than with each consumer's wire time
    holding a core (the consumers' full gaps on the shared device, as the FIFO stand-in alone had them)."""
    g = four_ranks_slow
    own = job_iteration_us(g)
    shared = job_iteration_us(share_cores(g, 2))
    s = share_cores(g, 2)
    held = s.replace(gap=np.r_[g.gap, np.zeros(len(s) - len(g))], device=np.r_[s.device[: len(g)], np.full(len(s) - len(g), -1)])
    assert own < shared < job_iteration_us(held)
    assert job_iteration_us(share_cores(g, 4)) == pytest.approx(own, rel=0.01)  # a core per rank: no queueing


def test_what_stays_on_the_cores_does_not_depend_on_the_link():
    """The consumers' overhead left on the shared cores (the wake-up) is the same at 1 Gbit/s and at a fifth of it:
    all that the slower link adds to their gaps is wire, and waits off the cores."""
    g = open_run(str(FAST), template=True).graph
    bw = current_topology(g).inter.bandwidth_bytes_per_s
    kept = {}
    for ratio in (1, 5):
        h = scale_fsdp_workers(set_link(g, bandwidth=bw / ratio), 4)
        s = share_cores(h, 2)
        kept[ratio] = s.gap[: len(h)].sum()
    assert kept[5] == pytest.approx(kept[1], rel=0.02)


def test_a_link_changed_and_changed_back_gives_the_gaps_it_started_from():
    g = open_run(str(FAST), template=True).graph
    bw = current_topology(g).inter.bandwidth_bytes_per_s
    back = set_link(set_link(g, bandwidth=bw / 5), bandwidth=bw)
    assert back.gap == pytest.approx(keep_stalls(g).gap, abs=1e-6)  # the measured gaps, and the stalls kept before their transfers
