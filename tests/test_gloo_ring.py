"""gloo's ring all-gather and all-reduce replayed message by message (``costmodel.gloo_ring``): the bytes-per-link rule
when the ranks arrive together, the head start the other links take while one rank is late, and both against the
measured completions of a real 6-rank ring on the namespace testbed (``fsdp/testbed-1x6-200mbit``)."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

import dagprof.graph.shared_collectives as shared
from dagprof.costmodel.gloo_ring import NOTICE_BYTES, head_start, ring_done
from dagprof.graph.build import build_graph
from dagprof.traces.dagprof_run import read_run

MIB, PER_BYTE = 1 << 20, 0.04  # us per byte: 200 Mbit/s


@pytest.mark.parametrize("n", [2, 3, 4, 6])
@pytest.mark.parametrize("gather", [True, False])
def test_ranks_arriving_together_move_the_bytes_per_link(n, gather):
    """(n-1)/n of the gathered bytes cross each link (an all-reduce: twice that), and the receives' notices (one each)."""
    done = ring_done(gather, [0.0] * n, MIB, PER_BYTE)
    wire = (1 if gather else 2) * (n - 1) / n * MIB * PER_BYTE
    assert np.allclose(done, wire, atol=4 * n * NOTICE_BYTES * PER_BYTE)


def test_a_late_rank_lets_the_other_links_start():
    """While the last rank is late, the all-gather's links away from it move their first segments: its first rank out
    finishes sooner after the last arrival than a ring that arrived together; the late rank's own links start from
    nothing, so it and its neighbour finish last. A ring of 2 has no other link."""
    late = [0.0, 0.0, 0.0, 0.0, 0.0, 7000.0]
    done = ring_done(True, late, MIB, PER_BYTE)
    together = ring_done(True, [0.0] * 6, MIB, PER_BYTE).min()
    assert done.min() - late[-1] < together - 3000
    assert done.argmax() in (4, 5, 0) and done.max() - late[-1] >= together
    assert head_start(True, np.array([late]), MIB, PER_BYTE) < 0.9
    assert head_start(True, np.array([[0.0, 7000.0]]), MIB, PER_BYTE) == pytest.approx(1.0)
    assert head_start(False, np.array([[0.0] * 6]), MIB, PER_BYTE) == pytest.approx(1.0)


def measured_rings(path, monkeypatch) -> list[tuple[str, int, np.ndarray, np.ndarray]]:
    """Each collective instance of a recording as the graph builder times it on the shared clock: its name, bytes, and
    each rank's transfer start and completion (``graph.shared_collectives._view``, observed as it runs)."""
    seen, view = [], shared._view

    def observed(asm, ends, ref_ns):
        v = view(asm, ends, ref_ns)
        seen.append((ends[0].name, int(ends[0].nbytes), v.join, v.done))
        return v
    monkeypatch.setattr(shared, "_view", observed)
    build_graph(read_run(path))
    return seen


def test_the_replay_meets_a_measured_ring(monkeypatch):
    """2 ranks at 200 Mbit/s (``fsdp/testbed-200mbit``, FSDP2 units of 1 MiB): replayed from each instance's measured
    transfer starts at the port's rate (1514 wire bytes per 1448 of TCP payload), the first rank out after the last start
    is within 5 % of the measured for the all-gathers and reduce-scatters (gloo's all-reduce ring); and the all-gather's
    late rank, whose recv-ready notice leaves behind the half-chunk it sent first, ends later by what the replay says."""
    per_byte = 8 / 200e6 * 1e6 * 1514 / 1448
    firsts, spread = {}, {}
    for name, nbytes, join, done in measured_rings(DATA / "fsdp" / "testbed-200mbit", monkeypatch):
        kind = name.split(" ", 1)[0]
        sim = ring_done(kind == "all_gather", join, nbytes, per_byte)
        firsts.setdefault(kind, []).append((done.min() - join.max()) / (sim.min() - join.max()))
        spread.setdefault(kind, []).append((done.mean() - done.min(), sim.mean() - sim.min()))
    assert set(firsts) == {"all_gather", "reduce_scatter"}
    for kind, ratios in firsts.items():
        assert abs(np.median(ratios) - 1) < 0.05, kind
    got, replayed = np.median(spread["all_gather"], axis=0)
    assert replayed > 4000 and abs(got / replayed - 1) < 0.2
