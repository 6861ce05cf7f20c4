"""A DP x TP ViT averaging its gradients itself, profiled by the Python API (``bench/tp_fresh/vit_tp_manual_dp.py``,
``tests/data/tp-fresh/vit-tp-api``: 4 gloo ranks, DP groups {0,2},{1,3}, TP groups {0,1},{2,3}, no DDP or FSDP).

Four answers its user met wrong (stop 60): "not a DDP job (compute only, no communication)" beside 24 all-reduces a
step; those all-reduces labelled "DP x4, group 0" and the TP ones "unknown"; ``--tp-degree`` "profiled: 1"; and the
hint for the missing sizes named only ``dagprof profile``, which refuses this job."""
from __future__ import annotations

import pytest
from testdata import DATA

from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.passes.link_fit import profiled_comm
from dagprof.passes.workers import refuse_degree
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.parallelism import Dim

RUN = DATA / "tp-fresh" / "vit-tp-api"


@pytest.fixture(scope="module")
def run():
    return read_run(RUN)


@pytest.fixture(scope="module")
def graph(run):
    return build_graph(run)


def test_the_collectives_are_said_not_compute_only(run):
    said = [str(w) for w in run.meta.warnings]
    assert not any("compute only" in w for w in said)
    assert any(w.startswith("no DDP or FSDP model: the 30 collectives a step per rank are the script's own calls") for w in said)


def test_the_data_parallel_groups_are_the_mesh_ones(run, graph):
    assert {t.rank: tuple(t.group_ranks[t.groups[0]]) for t in run.ranks} == {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}
    par = graph.meta.parallel
    assert par.dp_size == 2 and sorted(par.dp_groups) == [(0, 2), (1, 3)]
    dp = [g for g in par.groups if Dim.DP.text in g.dims]
    assert sorted(g.ranks for g in dp) == [(0, 2), (1, 3)] and all(g.dims == {"DP": 48} for g in dp)


def test_the_tensor_parallel_ones_are_labelled_by_their_group(graph):
    inside = graph.meta.parallel.in_op_groups
    assert {(g.group, g.dim) for g in inside} == {("0,1", "TP"), ("2,3", "TP")}
    assert sum(g.count for g in inside) == 24  # 6 a step on each of the 4 ranks, one step


def test_the_tp_degree_is_the_profiled_two(graph):
    refuse_degree(graph, Dim.TP, 2, "--tp-degree")  # the profiled degree is accepted
    with pytest.raises(DagprofError, match=r"a TP degree of 4 is not modelled \(profiled: 2\)"):
        refuse_degree(graph, Dim.TP, 4, "--tp-degree")


def test_the_sizes_hint_names_the_python_api(graph):
    with pytest.raises(DagprofError, match=r"dagprof\.profile\(DIR, \.\.\., record_shapes=True\)"):
        profiled_comm(graph)
