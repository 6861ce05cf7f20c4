"""``bench/fsdp_fresh/core_waits.py`` on the vendored 2-rank FSDP testbed recording (``fsdp/testbed-workers-resnet-2``, which
recorded its process CPU): ``--workers 4 --cores 2`` puts one gloo block per rank and call on the shared cores, with the
priced CPU, and every wait is a non-negative time (no timing)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "fsdp_fresh"))

import core_waits  # noqa: E402

from dagprof.graph.build_fsdp import fsdp_collectives  # noqa: E402
from dagprof.passes.comm_cpu import keep_comm_cpu  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search import scenario  # noqa: E402


@pytest.fixture(scope="module")
def profile():
    return open_run(DATA / "fsdp" / "testbed-workers-resnet-2").graph


def test_one_gloo_block_per_rank_and_call_with_its_waits(profile):
    c = scenario.Cluster(cores=2)
    marked = scenario.profiled_at(profile, c)
    g = scenario.apply(marked, scenario.Scenario(workers=4), c, scenario.base_topology(marked, c))
    w = core_waits.waits(g)
    calls = len(fsdp_collectives(g)) / max(len(g.meta.steps), 1)
    assert w.gloo_blocks == pytest.approx(calls)
    assert keep_comm_cpu(marked).meta.comm_cpu is not None and w.gloo_cpu_ms > 0
    assert w.ops_ms > w.gloo_cpu_ms > 0
    assert np.isfinite([w.gloo_wait_ms, w.ops_wait_ms]).all() and min(w.gloo_wait_ms, w.ops_wait_ms) >= -1e-9
    assert w.step_ms > 0
