"""Each what-if pass turns the graph of configuration A into that of B: compared with B built directly."""
import numpy as np
import pytest

from dagprof.costmodel.alphabeta import AlphaBeta
from dagprof.costmodel.collectives import allreduce_us
from dagprof.costmodel.topology import CollectiveSpec, Topology
from dagprof.errors import DagprofError
from dagprof.passes import expand_collectives, fit_topology, partition_tensors, scale_compute, scale_workers, set_buckets, set_link, set_scheme
from dagprof.passes.link_fit import find_collectives
from dagprof.traces.events import Kind

from test_passes_fixture import LINK, ddp_graph, iter_us


def test_fit_recovers_the_link():
    # slow compute: no all-reduce queues behind another, so the profiled spans are the transfers
    topo = fit_topology(ddp_graph(cap=1e6, known_link=False, compute_scale=0.01))
    # the profile's latency is kept as a per-collective overhead (2 ranks: 2 messages of alpha)
    assert topo.overhead_us == pytest.approx(2 * LINK.alpha_us, rel=1e-6) and topo.inter.alpha_us == 0
    assert topo.inter.beta_us_per_byte == pytest.approx(LINK.beta_us_per_byte, rel=1e-6)
    g = set_link(ddp_graph(cap=1e6, known_link=False, compute_scale=0.01), bandwidth=1e9)
    truth = ddp_graph(cap=1e6, link=AlphaBeta(LINK.alpha_us, 1e-3), compute_scale=0.01)
    assert iter_us(g) == pytest.approx(iter_us(truth), rel=1e-9)


@pytest.mark.parametrize("cap", [1e6, 3e6, 5e6, 1e12])
def test_rebucket_matches_graph_built_with_that_cap(cap):
    g = set_buckets(ddp_graph(cap=1e6), cap)
    assert iter_us(g) == pytest.approx(iter_us(ddp_graph(cap=cap)), rel=1e-9)
    assert len(find_collectives(g)) == len(find_collectives(ddp_graph(cap=cap)))


def test_rebucket_with_a_small_first_bucket():
    g = set_buckets(ddp_graph(cap=1e6), 5e6, first_bucket_bytes=2**20)
    assert iter_us(g) == pytest.approx(iter_us(ddp_graph(cap=5e6, first=2**20)), rel=1e-9)


def test_rebucket_without_layer_sizes_keeps_measured_boundaries():
    g = set_buckets(ddp_graph(cap=1e6, layer_nbytes=False), 1e12)
    assert iter_us(g) == pytest.approx(iter_us(ddp_graph(cap=1e12)), rel=1e-9)
    kept = set_buckets(ddp_graph(cap=3e6, layer_nbytes=False))
    assert iter_us(kept) == pytest.approx(iter_us(ddp_graph(cap=3e6)), rel=1e-9)


def test_overlap_off_matches():
    g = set_buckets(ddp_graph(cap=3e6), None, overlap=False)
    assert iter_us(g) == pytest.approx(iter_us(ddp_graph(cap=3e6, overlap=False)), rel=1e-9)
    assert iter_us(g) > iter_us(ddp_graph(cap=3e6))


@pytest.mark.parametrize("bw,lat", [(50e6, None), (2e9, 5.0), (None, 500.0)])
def test_link_what_if_matches(bw, lat):
    new = AlphaBeta(LINK.alpha_us if lat is None else lat, LINK.beta_us_per_byte if bw is None else 1e6 / bw)
    g = set_link(ddp_graph(), bandwidth=bw, latency_us=lat)
    assert iter_us(g) == pytest.approx(iter_us(ddp_graph(link=new)), rel=1e-9)


@pytest.mark.parametrize("n", [1, 3, 4, 8])
def test_scale_workers_replicated_and_folded_match_ground_truth(n):
    truth = iter_us(ddp_graph(ranks=n))
    rep = scale_workers(ddp_graph(ranks=2), n, replicate=True)
    fold = scale_workers(ddp_graph(ranks=2), n, replicate=False)
    assert rep.world_size == n and rep.meta.world_size == n
    assert iter_us(rep) == pytest.approx(truth, rel=1e-9)
    assert iter_us(fold) == pytest.approx(truth, rel=1e-9)


def test_scale_to_4096_ranks_folds():
    g = scale_workers(ddp_graph(ranks=2), 4096)
    assert g.world_size == 2 and g.meta.world_size == 4096
    c = find_collectives(g)[0]
    assert g.dur[c.comm] == pytest.approx(allreduce_us(float(g.nbytes[c.comm]), Topology.flat(4096, LINK)))
    assert iter_us(g) > iter_us(ddp_graph(ranks=2))


def test_compute_speed():
    assert iter_us(scale_compute(ddp_graph(), 2.0)) == pytest.approx(iter_us(ddp_graph(compute_scale=2.0)), rel=1e-9)


def test_scheme_and_partition():
    ps = set_scheme(ddp_graph(ranks=4), CollectiveSpec.parse("ps:2"))
    c = find_collectives(ps)[0]
    assert ps.dur[c.comm] == pytest.approx(allreduce_us(float(ps.nbytes[c.comm]), Topology.flat(4, LINK), CollectiveSpec.parse("ps:2")))
    parts = partition_tensors(ddp_graph(), 4)
    assert len(find_collectives(parts)) == 4 * len(find_collectives(ddp_graph()))
    assert iter_us(parts) > iter_us(ddp_graph())  # one channel: 4x the latency, no parallelism to win


def test_passes_compose():
    g = scale_compute(set_link(set_buckets(scale_workers(ddp_graph(cap=1e6), 4), 1e12), bandwidth=1e9), 2.0)
    truth = ddp_graph(ranks=4, cap=1e12, link=AlphaBeta(LINK.alpha_us, 1e-3), compute_scale=2.0)
    assert iter_us(g) == pytest.approx(iter_us(truth), rel=1e-9)


@pytest.mark.parametrize("scheme", ["ring", "tree", "ps:2"])
def test_fine_grained_expansion_is_no_slower_than_coarse(scheme):
    coarse = set_scheme(ddp_graph(ranks=4, cap=2e6), CollectiveSpec.parse(scheme))
    fine = expand_collectives(coarse)
    assert len(fine) > len(coarse)
    assert (fine.kind == Kind.COMM).sum() > (coarse.kind == Kind.COMM).sum()
    compute_only = iter_us(set_link(ddp_graph(ranks=4, cap=2e6), bandwidth=1e15, latency_us=0.0))
    assert compute_only <= iter_us(fine) <= iter_us(coarse) * (1 + 1e-9)


def test_impossible_requests_are_one_line_errors():
    g = ddp_graph()
    for bad in (lambda: scale_workers(g, 0), lambda: set_link(g, bandwidth=-1.0), lambda: set_link(g, latency_us=-1.0),
                lambda: set_buckets(g, 0.0), lambda: scale_compute(g, 0.0), lambda: CollectiveSpec.parse("ps:0"),
                lambda: CollectiveSpec.parse("butterfly"), lambda: partition_tensors(g, 0),
                lambda: expand_collectives(scale_workers(g, 128))):
        with pytest.raises(DagprofError):
            bad()
    g = ddp_graph(known_link=False)
    no_comm = g.replace(kind=np.where(g.kind == Kind.COMM, Kind.OTHER, g.kind))
    with pytest.raises(DagprofError):
        set_link(no_comm, bandwidth=1e9)
