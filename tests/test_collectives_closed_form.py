"""Fine-grained collective sub-graphs replay to the closed forms of costmodel.collectives: one algorithm object, both views."""
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from dagprof.costmodel.alphabeta import AlphaBeta
from dagprof.costmodel.collectives import algorithm, allreduce_us
from dagprof.costmodel.topology import CollectiveSpec, Topology
from dagprof.graph.collectives import add_allreduce
from dagprof.graph.dag import DeviceKind, GraphBuilder
from dagprof.replay import replay
from dagprof.traces.events import Kind

LINK = AlphaBeta(alpha_us=7.0, beta_us_per_byte=1e-3, gamma_us_per_byte=1e-4)
FAST = AlphaBeta(alpha_us=1.0, beta_us_per_byte=1e-5)


def one_collective(topo: Topology, spec: CollectiveSpec, nbytes: float, stagger: float = 0.0):
    b = GraphBuilder()
    n = topo.world_size
    ready, done = [], []
    for r in range(n):
        lane = b.device(f"rank{r}/main", DeviceKind.COMPUTE, r)
        ready.append([b.add_node("ready", Kind.BACKWARD, rank=r, device=lane, dur=stagger * r)])
        done.append(b.add_node("done", Kind.COMM_WAIT, rank=r, device=lane))
    add_allreduce(b, ready, done, nbytes, topo, spec)
    g = b.build()
    return g, replay(g)


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_ring_time_and_bytes_per_link(n):
    m = 6e6
    g, res = one_collective(Topology.flat(n, LINK), CollectiveSpec(), m)
    expect = 2 * (n - 1) * (LINK.alpha_us + m / n * LINK.beta_us_per_byte) + (n - 1) * m / n * LINK.gamma_us_per_byte
    assert res.makespan == pytest.approx(expect)
    assert res.makespan == pytest.approx(allreduce_us(m, Topology.flat(n, LINK)))
    links = [d for d in g.devices if d.name.startswith("link")]
    assert len(links) == n
    for i, d in enumerate(g.devices):
        if d.name.startswith("link"):
            assert g.nbytes[g.device == i].sum() == pytest.approx(2 * (n - 1) / n * m, rel=1e-6)


def test_ring_waits_for_the_last_rank():
    g, res = one_collective(Topology.flat(4, LINK), CollectiveSpec(), 1e6, stagger=100.0)
    assert res.makespan == pytest.approx(300.0 + allreduce_us(1e6, Topology.flat(4, LINK)))


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_tree_matches_closed_form(n):
    topo = Topology.flat(n, LINK)
    _, res = one_collective(topo, CollectiveSpec.parse("tree"), 2e6)
    assert res.makespan == pytest.approx(allreduce_us(2e6, topo, CollectiveSpec.parse("tree")))


@pytest.mark.parametrize("hosts,per", [(2, 2), (3, 4), (4, 1), (1, 4)])
def test_hierarchical_matches_closed_form(hosts, per):
    topo = Topology(hosts, per, FAST, LINK)
    spec = CollectiveSpec.parse("hier")
    _, res = one_collective(topo, spec, 4e6)
    assert res.makespan == pytest.approx(allreduce_us(4e6, topo, spec))


def test_hierarchical_beats_flat_ring_on_fast_intra_links():
    topo = Topology(4, 8, FAST, LINK)
    assert allreduce_us(64e6, topo, CollectiveSpec.parse("hier")) < allreduce_us(64e6, topo)


@pytest.mark.parametrize("n,k", [(2, 1), (4, 2), (8, 4), (3, 3), (2, 3), (1, 4)])
def test_ps_matches_closed_form(n, k):
    topo = Topology.flat(n, LINK)
    spec = CollectiveSpec.parse(f"ps:{k}")
    g, res = one_collective(topo, spec, 8e6)
    assert res.makespan == pytest.approx(allreduce_us(8e6, topo, spec))
    names = [d.name for d in g.devices]
    for s in range(k):  # every server port carries N parts each way, every worker port the whole tensor
        assert g.nbytes[g.device == names.index(f"port ps{s} in")].sum() == pytest.approx(8e6 * n / k, abs=1)
    for w in range(n):
        assert g.nbytes[g.device == names.index(f"port w{w} out")].sum() == pytest.approx(8e6, abs=1)
        assert g.nbytes[g.device == names.index(f"port w{w} in")].sum() == pytest.approx(8e6, abs=1)


def test_ps_with_more_servers_than_workers_is_bound_by_the_worker_port():
    """2 workers, 8 servers: a server's port carries 2/8 of the tensor, a worker's port all of it."""
    topo = Topology.flat(2, LINK)
    _, res = one_collective(topo, CollectiveSpec.parse("ps:8"), 8e6)
    assert res.makespan > 2 * 8e6 * LINK.beta_us_per_byte
    assert res.makespan == pytest.approx(allreduce_us(8e6, topo, CollectiveSpec.parse("ps:8")))


@pytest.mark.parametrize("scheme", ["ring", "tree", "hier", "ps:2"])
def test_per_collective_overhead_is_paid_once(scheme):
    spec = CollectiveSpec.parse(scheme)
    topo = Topology(4, 1, LINK, LINK, overhead_us=123.0)
    _, res = one_collective(topo, spec, 1e6)
    assert res.makespan == pytest.approx(allreduce_us(1e6, topo, spec))
    assert allreduce_us(1e6, topo, spec) == pytest.approx(123.0 + allreduce_us(1e6, Topology.flat(4, LINK), spec))


def test_single_rank_costs_nothing():
    _, res = one_collective(Topology.flat(1, LINK), CollectiveSpec(), 1e6)
    assert res.makespan == 0.0


LINKS = st.builds(AlphaBeta, st.floats(0.0, 50.0), st.floats(0.0, 1e-2), st.sampled_from([0.0, 1e-4]))


@settings(max_examples=120, deadline=None, derandomize=True)
@given(scheme=st.sampled_from(["ring", "tree", "hier", "ps:1", "ps:3", "ps:8"]), hosts=st.integers(1, 5), per=st.integers(1, 4),
       intra=LINKS, inter=LINKS, nbytes=st.floats(1.0, 1e8), overhead=st.sampled_from([0.0, 25.0]))
def test_every_scheme_replays_its_steps_to_its_closed_form(scheme, hosts, per, intra, inter, nbytes, overhead):
    """The expansion of an algorithm's steps, replayed alone on idle links, takes its closed form.

    Two closed forms approximate on hosts of several devices whose two links differ: they price every
    hop at the slowest one, chosen by latency and bandwidth alone. So the links share their gamma there
    (else a ring's reduce rounds may be slower on the other link), and a tree, whose deepest path mixes
    fast and slow hops, only bounds its replay from above.
    """
    mixed = hosts > 1 and per > 1
    if mixed:
        intra = replace(intra, gamma_us_per_byte=inter.gamma_us_per_byte)
    topo, spec = Topology(hosts, per, intra, inter, overhead_us=overhead), CollectiveSpec.parse(scheme)
    _, res = one_collective(topo, spec, nbytes)
    closed = allreduce_us(nbytes, topo, spec)
    if mixed and scheme == "tree":
        assert res.makespan <= closed * (1 + 1e-9)
    else:
        assert res.makespan == pytest.approx(closed, rel=1e-9, abs=1e-9)
    steps = algorithm(spec).steps(nbytes, topo)
    assert len(steps.results) == topo.world_size and all(j < i for i, m in enumerate(steps.messages) for j in m.after)
