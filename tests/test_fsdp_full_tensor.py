"""An FSDP2 job that saves a plain state_dict inside the profiled window: every rank gathers each sharded parameter with
``DTensor.full_tensor()`` (``bench/fsdp_fresh/prefetch_offload.py --save-every 2``, 2 ranks, 3 blocks:
``tests/data/fsdp-fresh/vit-save``, saves in steps 6 and 8). Those all-gathers were host time of no collective: not
joined to the peer, not priced by the link. Now each is a collective of no unit, joined across ranks, priced as an
all-gather; FSDP's passes leave it alone, and ``--template`` averages a saving step only with the other saving step."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from testdata import DATA, copy_fixture, edit_json

from dagprof.errors import DagprofError
from dagprof.graph.build_fsdp import allreduce_equivalent_bytes, check_fsdp_edges, fsdp_collectives, issuers, job_collective_steps
from dagprof.passes.average_steps import average_steps
from dagprof.passes.comm import current_topology, set_link
from dagprof.passes.fsdp import set_reshard
from dagprof.pipeline import open_run
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind
from dagprof.traces.run_schema import FULL_TENSOR

RUN = DATA / "fsdp-fresh" / "vit-save"
SAVES = (6, 8)  # (step + 1) % 2 == 0 after steps 5 and 7: the save runs before the next step's forward


@pytest.fixture(scope="module")
def graph():
    return open_run(RUN).graph


def _gathers(g) -> np.ndarray:
    return np.array([v for v in np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0)).tolist()
                     if g.node_name(v).startswith(f"{FULL_TENSOR} ")], dtype=np.int64)


def test_each_parameter_gathered_once_a_save():
    for t in read_run(RUN).ranks:
        info = t.meta.fsdp
        own = [c for c in info.collectives if c.phase == FULL_TENSOR]
        assert {(c.unit, c.kind, c.group, c.dtype) for c in own} == {(-1, "all_gather", "0,1", "float32")}
        params = sum(len(u.params) for u in info.units)
        assert len(own) == 2 * params  # one all-gather per parameter, two saves
        assert sum(c.nbytes for c in own) == 2 * 4 * sum(u.numel for u in info.units)  # the full fp32 parameters


def test_joined_across_ranks_and_left_to_fsdp(graph):
    g = graph
    gathers = _gathers(g)
    assert len(gathers) == 2 * sum(len(u.params) for u in read_run(RUN).ranks[0].meta.fsdp.units)
    assert all(sorted(issuers(g, int(v))) == [0, 1] for v in gathers)  # a join of both ranks, not host time
    assert Counter(g.step[gathers].tolist()) == Counter({s: len(gathers) // 2 for s in SAVES})
    assert job_collective_steps(g).tolist() == list(SAVES)
    assert not set(gathers.tolist()) & {c.node for c in fsdp_collectives(g)}  # no FSDP unit's collective
    check_fsdp_edges(g)
    # an all-gather on 2 ranks moves half its bytes per link: half an all-reduce of its gathered bytes
    assert np.allclose(allreduce_equivalent_bytes(g, gathers), g.nbytes[gathers] / 2)
    kept = set_reshard(g, False)  # FSDP's passes move FSDP's all-gathers; the save's stay
    assert len(_gathers(kept)) == len(gathers)


def test_link_prices_them(graph):
    g = graph
    gathers = _gathers(g)
    beta = current_topology(g).inter.beta_us_per_byte
    grew = set_link(g, 1e5 / beta).dur[gathers] - set_link(g, 1e6 / beta).dur[gathers]  # a tenth of the fitted bandwidth
    wire = allreduce_equivalent_bytes(g, gathers) * beta * 9  # us: 10x the time per byte, 9x more
    assert np.all(grew > 0) and grew.sum() == pytest.approx(wire.sum(), rel=0.05)


def test_template_averages_saving_steps_apart(graph):
    g = graph
    avg = average_steps(g)
    for r in (0, 1):
        name = g.names.index(f"rank{r}.other:pre-forward")  # the gap before the forward, where the save's own host time is
        first = {s: int(np.flatnonzero((g.step == s) & (g.name == name))[0]) for s in g.meta.steps[1:]}
        saving = [first[s] for s in SAVES]
        plain = [v for s, v in first.items() if s not in SAVES]
        assert avg.dur[saving[0]] == pytest.approx(np.mean(g.dur[saving]))  # twins of each other only
        assert avg.dur[plain[0]] == pytest.approx(avg.dur[plain[-1]])


def test_said_which_steps_saved():
    said = [w for w in open_run(RUN).warnings if "full_tensor gathers" in w]
    assert len(said) == 1 and "2 of 5 profiled steps (step 6, 8)" in said[0] and "--template averages those steps only" in said[0]


def test_damaged_group_refused(tmp_path):
    run = copy_fixture(tmp_path, "fsdp-fresh/vit-save")

    def outside(doc):
        k = next(i for i, c in enumerate(doc["fsdp"]["collectives"]) if c["phase"] == FULL_TENSOR)
        doc["fsdp"]["collectives"][k]["group"] = "0,7"

    edit_json(run / "rank0.json", outside)
    with pytest.raises(DagprofError, match="full_tensor.*0,7.*damaged"):
        read_run(run)
