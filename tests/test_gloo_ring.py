"""gloo's ring all-gather and all-reduce replayed message by message (``costmodel.gloo_ring``): the bytes-per-link rule
when the ranks arrive together, the head start the other links take while one rank is late, and both against the
measured completions of a real 6-rank ring on the namespace testbed (``fsdp/testbed-1x6-200mbit``)."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

import dagprof.graph.shared_collectives as shared
from dagprof.costmodel.gloo_ring import NOTICE_BYTES, head_start, ring_done, unhidden_reduce_us
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


def test_a_segments_sum_hides_behind_the_next_segment_in_flight():
    """An all-reduce's reduce-scatter sums each received segment before its next send, the other segment in flight
    meanwhile (gloo's ``allreduce.cc``): on 2 ranks (segments of a quarter of the bytes) a sum no longer than a segment's
    wire time adds only the last segment's sum; a longer one is serial for both segments, less the one wire time it
    overlaps. ``unhidden_reduce_us`` reads the sum back from either excess."""
    bare = ring_done(False, [0.0, 0.0], MIB, PER_BYTE).min()
    segment = MIB / 4 * PER_BYTE
    for r in (0.5 * segment, segment, 3.0 * segment):
        excess = ring_done(False, [0.0, 0.0], MIB, PER_BYTE, r).min() - bare
        assert excess == pytest.approx(r + max(r - segment, 0.0), abs=4 * NOTICE_BYTES * PER_BYTE)
        assert unhidden_reduce_us(excess, MIB, 2, PER_BYTE) == pytest.approx(r, rel=1e-6)
    # 4 ranks: more of the sums stay serial where they outlast the wire, still one where they do not
    bare4 = ring_done(False, [0.0] * 4, MIB, PER_BYTE).min()
    slow = ring_done(False, [0.0] * 4, MIB, PER_BYTE, 0.5 * MIB / 8 * PER_BYTE).min() - bare4
    assert slow == pytest.approx(0.5 * MIB / 8 * PER_BYTE, abs=16 * NOTICE_BYTES * PER_BYTE)
    fast = ring_done(False, [0.0] * 4, MIB, PER_BYTE, 3.0 * MIB / 8 * PER_BYTE).min() - bare4
    assert fast > 2 * 3.0 * MIB / 8 * PER_BYTE
    assert unhidden_reduce_us(0.0, MIB, 4, PER_BYTE) == 0.0 and unhidden_reduce_us(5.0, MIB, 1, PER_BYTE) == 0.0


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
