"""An FSDP1 ``HYBRID_SHARD`` job on a 2 x 2 mesh (``bench/fsdp_fresh/fsdp1_hybrid_seq2seq.py``, ``tests/data/fsdp/fsdp1-hybrid``).

Two answers its user met wrong (stop 60): ``whatif --workers 8`` was refused as if ``--mesh`` had been given, and
``optimize``'s advice to keep units gathered named ``SHARD_GRAD_OP``, which shards over every rank and drops the
replicas the search kept (the hybrid form is ``_HYBRID_SHARD_ZERO2``)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from testdata import DATA

from dagprof.cli.cmd_optimize import recommendation
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.passes.fsdp_mesh import scale_fsdp_workers
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.run_schema import FSDP1_API

RUN = DATA / "fsdp" / "fsdp1-hybrid"


@pytest.fixture(scope="module")
def graph():
    return build_graph(read_run(RUN))


def test_the_profile_is_fsdp1_on_a_two_by_two_mesh(graph):
    fs = graph.meta.fsdp
    assert fs.api == FSDP1_API and {tuple(u.mesh) for u in fs.units} == {(2, 2)}


def test_more_workers_are_refused_naming_workers_not_mesh(graph):
    with pytest.raises(DagprofError) as err:
        scale_fsdp_workers(graph, 8)
    assert str(err.value).startswith("--workers 8: this FSDP1 HYBRID_SHARD job (mesh 2x2) would grow its replicate dimension to 4x2")
    assert "--mesh" not in str(err.value)


def test_the_advice_keeps_the_replicas():
    res = SimpleNamespace(memory_reason=None)
    hybrid = recommendation(res, "s.json", FSDP1_API, hybrid=True)
    assert "ShardingStrategy._HYBRID_SHARD_ZERO2) for a unit kept gathered" in hybrid and "HYBRID_SHARD for one resharded" in hybrid
    assert "SHARD_GRAD_OP" not in hybrid.replace("_HYBRID_SHARD_ZERO2", "")
    plain = recommendation(res, "s.json", FSDP1_API)
    assert "ShardingStrategy.SHARD_GRAD_OP) for a unit kept gathered" in plain and "FULL_SHARD for one resharded" in plain
