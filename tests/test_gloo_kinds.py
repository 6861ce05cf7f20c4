"""gloo's collectives of each kind on 2 and 4 ranks, as a user's Kineto trace has them (``tests/data/gloo-kinds``: plain
``torch.profiler`` with ``record_shapes`` on the testbed's shaped loopback, ``bench/bcast_sweep.py --trace``), priced by
the link the same trace's all-reduces fit against what each took."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from testdata import DATA

from dagprof.align.one_clock import on_one_clock
from dagprof.costmodel.collectives import allreduce_us
from dagprof.costmodel.topology import Topology, fit_sweep
from dagprof.graph.build_fsdp import allreduce_equivalent_bytes
from dagprof.pipeline import open_run
from dagprof.traces.events import CommKind, Kind

KINDS = DATA / "gloo-kinds"


def measured(run, matching) -> dict[tuple[CommKind, int], float]:
    """(kind, bytes) -> median over its calls of the slowest rank's transfer (every call entered from a barrier, so a rank's
    transfer is the call: the root's gather ends with the last chunk it receives)."""
    out: dict[tuple[CommKind, int], list[float]] = {}
    for k, it in enumerate(matching.instances):
        durs = [float(t.events.dur[i]) for t, m in zip(run.ranks, matching.instance) for i in np.flatnonzero((m == k) & (t.events.kind == Kind.COMM))]
        out.setdefault((it.kind, it.nbytes), []).append(max(durs))
    return {key: float(np.median(v)) for key, v in out.items()}


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_gather_or_scatter_costs_the_all_gather_of_every_ranks_chunk(ranks):
    """On the one shaped loopback (``--half-duplex``: the medium carries (N-1) chunks of a gather or scatter against the
    all-reduce's 2 (N-1)), the graph's gathers, scatters and all-to-alls of 0.25-2 MB priced as the link model prices them
    (``allreduce_equivalent_bytes``: a gather the all-gather of N chunks; ``Topology.one_way_share``) come within 15 % of
    what each took, on 2 ranks and on 4. Priced as an all-reduce of the chunk (before), each gather and scatter cost twice
    what it took."""
    o = open_run(KINDS / f"loopback-n{ranks}")
    took = measured(*on_one_clock(o.run))
    sweep = sorted((b, us) for (kind, b), us in took.items() if kind == CommKind.ALL_REDUCE)
    topo = replace(Topology.flat(ranks, fit_sweep(*(np.array(x, dtype=float) for x in zip(*sweep)), ranks)), half_duplex=True)
    g = o.graph
    priced: dict[tuple[CommKind, int], float] = {}
    for kind in (CommKind.GATHER, CommKind.SCATTER, CommKind.ALL_TO_ALL):
        idx = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.comm_kind == kind))
        for v, m in zip(idx.tolist(), allreduce_equivalent_bytes(g, idx).tolist()):
            priced[(kind, int(g.nbytes[v]))] = allreduce_us(m * topo.one_way_share(kind), topo)
    assert {k for k, _ in priced} == {CommKind.GATHER, CommKind.SCATTER, CommKind.ALL_TO_ALL} and len(priced) == 9
    for (kind, nbytes), us in priced.items():
        assert 0.85 < us / took[(kind, nbytes)] < 1.15, (kind.name, nbytes, us, took[(kind, nbytes)])
        if kind != CommKind.ALL_TO_ALL:
            assert allreduce_us(nbytes, topo) / took[(kind, nbytes)] > 1.8


def test_the_replay_prices_the_traces_gathers_and_scatters_as_they_took():
    """``retime_collectives`` on the 4-rank trace's collectives taken as data-parallel (a user's trace labels them unknown,
    which keep their measured time): on the shaped loopback (``half_duplex``, the link its all-reduces fit) each gather
    and scatter comes within 15 % of what it took (its root's port moves 3 chunks, the medium carries 3 where an
    all-reduce of the chunk puts 6 on it), where it had been priced at the all-reduce of its chunk: twice that."""
    from dagprof.passes.comm import retime_collectives
    from dagprof.traces.parallelism import Dim

    o = open_run(KINDS / "loopback-n4")
    took = measured(*on_one_clock(o.run))
    sweep = sorted((b, us) for (kind, b), us in took.items() if kind == CommKind.ALL_REDUCE)
    topo = replace(Topology.flat(4, fit_sweep(*(np.array(x, dtype=float) for x in zip(*sweep)), 4)), half_duplex=True)
    g = o.graph
    shared = (g.kind == Kind.COMM) & (g.rank < 0)
    h = retime_collectives(g.replace(dim=np.where(shared, Dim.DP, g.dim), meta=g.meta.replace(parallel=None)), topo)
    rooted = np.flatnonzero(shared & np.isin(g.comm_kind, (CommKind.GATHER, CommKind.SCATTER)))
    assert len(rooted) == 12
    for v in rooted.tolist():
        assert 0.85 < h.dur[v] / took[(CommKind(int(g.comm_kind[v])), int(g.nbytes[v]))] < 1.15


def test_on_switched_ports_a_4_rank_gather_costs_its_roots_three_chunks():
    """``ports-n4``: each rank in its own namespace, its port shaped both ways (``--both-ways``, as a switch port). A
    gather's or scatter's root port carries 3 chunks of it, the all-gather's price (twice the all-reduce of the chunk):
    from 2 MB on, priced by the link the all-reduces fit, each gather and scatter comes within 10 % of what it took, and an
    all-to-all (the whole buffer through one port, ``all_to_all_factor``) within 15 %; priced as the all-reduce of its
    chunk (before), a gather took twice its price."""
    o = open_run(KINDS / "ports-n4")
    took = measured(*on_one_clock(o.run))
    sweep = sorted((b, us) for (kind, b), us in took.items() if kind == CommKind.ALL_REDUCE)
    topo = Topology.flat(4, fit_sweep(*(np.array(x, dtype=float) for x in zip(*sweep)), 4))
    g = o.graph
    checked = 0
    for kind in (CommKind.GATHER, CommKind.SCATTER, CommKind.ALL_TO_ALL):
        idx = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.comm_kind == kind) & (g.nbytes >= 2 << 20))
        for v, m in zip(idx.tolist(), allreduce_equivalent_bytes(g, idx).tolist()):
            ratio = allreduce_us(m, topo) / took[(kind, int(g.nbytes[v]))]
            assert (0.9 < ratio < 1.1) if kind != CommKind.ALL_TO_ALL else (0.85 < ratio < 1.15), (kind.name, int(g.nbytes[v]), ratio)
            if kind != CommKind.ALL_TO_ALL:
                assert allreduce_us(float(g.nbytes[v]), topo) / took[(kind, int(g.nbytes[v]))] < 0.6
            checked += 1
    assert checked == 12
