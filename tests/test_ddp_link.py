"""DDP -> FSDP: the link for FSDP2's blocking collectives from a DDP profile whose buckets ran beside the backward.

On two gloo lanes the link is fitted as the buckets' total time over their bytes (``passes.link_fit._fit_total``), each
bucket's all-reduce beside the backward, its threads sharing the host's cores with the ranks' compute. The pace they got
(``passes.link_fit.gloo_pace``: min(1, cores / (ranks computing + ranks)) over each collective's replayed time) is
measured once where the graph is built (``GraphMeta.comm_pace``), and the conversion prices FSDP2's collectives, which
block their ranks, at the fit's time per byte times that pace (``passes.data_parallel.idle_link``), unless the what-if
was given a link. ``tests/data/lora`` is a 2-rank LoRA fine-tune on 2 cores (``bench/fsdp_fresh/lora_finetune.py``).
"""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

from dagprof.costmodel.fsdp_costs import FSDP_HOST
from dagprof.graph.build import build_graph
from dagprof.passes.data_parallel import conversion_note, ddp_to_fsdp, idle_link
from dagprof.passes.link_fit import fit_topology, gloo_pace, profiled_comm, with_gloo_pace
from dagprof.passes.overlap import slowed_nodes
from dagprof.replay import replay
from dagprof.search.scenario import Cluster, Scenario, apply, base_topology
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind


@pytest.fixture(scope="module")
def lora():
    return build_graph(read_run(DATA / "lora" / "ddp-0"))


def test_the_pace_counts_each_collectives_time_at_the_share_of_a_core_its_threads_got(lora):
    """2 ranks on 2 cores: a collective's time counts whole while no rank computes, 2/3 while one does, 1/2 while both
    do; checked on a 1 us grid of the replayed timeline."""
    assert lora.meta.comm_lanes == 2 and lora.meta.host_cpus == {"vm": (2, 2)}
    res = replay(lora)
    work = slowed_nodes(lora)
    want, total = 0.0, 0.0
    for c in profiled_comm(lora, overlapping=True):
        t = np.arange(res.start[c], res.end[c], 1.0) + 0.5
        k = sum(((res.start[work[lora.rank[work] == r], None] <= t) & (t < res.end[work[lora.rank[work] == r], None])).any(axis=0)
                for r in (0, 1))
        want += float(np.minimum(1.0, 2.0 / (k + 2)).sum())
        total += float(lora.dur[c])
    pace = gloo_pace(lora, res)
    assert 0.5 < pace < 1.0
    assert pace == pytest.approx(want / total, rel=0.01)
    assert with_gloo_pace(lora, replay).meta.comm_pace == pytest.approx(pace)


def test_no_pace_where_the_profile_does_not_tell_it(lora):
    """Not measured: the buckets on one lane (their fit is not their total time), an unknown host, ranks on several hosts."""
    assert with_gloo_pace(lora.replace(meta=lora.meta.replace(comm_lanes=1)), replay).meta.comm_pace is None
    res = replay(lora)
    assert gloo_pace(lora.replace(meta=lora.meta.replace(host_cpus={})), res) is None
    assert gloo_pace(lora.replace(meta=lora.meta.replace(host_cpus={"a": (1, 2), "b": (1, 2)})), res) is None


def test_fsdp_collectives_are_priced_at_the_fitted_link_times_the_pace(lora):
    """Each FSDP collective's bytes' time is the fit's times the pace, its fixed cost per call gloo's measured one; a link
    given to the what-if, or a graph without the pace, keeps the fit's time per byte."""
    g = with_gloo_pace(lora, replay)
    pace = g.meta.comm_pace
    topo = fit_topology(g)
    assert idle_link(topo, g).inter.beta_us_per_byte == pytest.approx(topo.inter.beta_us_per_byte * pace)
    assert idle_link(topo, lora) == topo
    idle, given, plain = ddp_to_fsdp(g), ddp_to_fsdp(g, given_link=True), ddp_to_fsdp(lora)
    comm = np.flatnonzero((idle.kind == Kind.COMM) & (idle.rank < 0) & (idle.nbytes > 0))
    assert len(comm) == 8 * len(g.meta.steps)
    call = FSDP_HOST[g.meta.torch_minor].call_us
    assert np.allclose(given.dur[comm], plain.dur[comm])
    assert np.allclose(idle.dur[comm] - call, (given.dur[comm] - call) * pace)
    assert "at the 0." in conversion_note("fsdp", False, g) and "of a core their threads got beside" in conversion_note("fsdp", False, g)
    assert "of a core their threads got beside" not in conversion_note("fsdp", False, lora)


def test_a_what_if_on_a_given_topology_keeps_it(lora):
    """--topology gives the link: the conversion prices on it as given, the pace notwithstanding."""
    g = with_gloo_pace(lora, replay)
    s = Scenario(data_parallel="fsdp")
    c = Cluster(topology="10gbe:2")
    on_given = apply(g, s, c, base_topology(g, c))
    unpaced = apply(lora, s, c, base_topology(lora, c))
    comm = (on_given.kind == Kind.COMM) & (on_given.rank < 0)
    assert np.allclose(on_given.dur[comm], unpaced.dur[comm])
    fitted = apply(g, s, Cluster(), base_topology(g, Cluster()))
    assert fitted.dur[comm].sum() < apply(lora, s, Cluster(), base_topology(lora, Cluster())).dur[comm].sum()
