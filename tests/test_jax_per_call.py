"""``bench/jax_workers_categories.py --per-call``: gloo's busy thread's CPU and the collectives per gloo call and ring step,
on a real 2-rank JAX recording (one gloo call per operand)."""
from __future__ import annotations

import os
import sys

import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from jax_workers_categories import per_call, threads  # noqa: E402

from dagprof.pipeline import open_run  # noqa: E402

RUN = DATA / "tf-jax" / "shardmap-threads"


def test_gloo_per_call_and_ring_step_is_its_thread_a_step_over_the_calls_ring_steps():
    g = open_run(RUN).graph
    got = per_call(g)
    ring = got["calls"] * 2 * (int(g.world_size) - 1)  # 2 ranks: an all-reduce's 2 ring steps a call
    assert got["calls"] == g.meta.collective_operands_per_step > 0
    assert got["gloo"] * ring == pytest.approx(threads(g)["gloo"])  # the same steps and thread as the categories' table
    assert 0 < got["gloo q25"] <= got["gloo"]
    assert got["comm"] > 0
