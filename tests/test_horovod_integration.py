"""Opt-in: re-record the Horovod fixtures from scratch with real horovodrun jobs, then read and replay them.

Skipped unless ``DAGPROF_HOROVOD_VENV`` names a venv with Horovod built for PyTorch + gloo
(bench/horovod/build_horovod.sh; Horovod has no wheel for current torch, so it is a source
build of several minutes and stays out of the default test run)::

    bench/horovod/build_horovod.sh /work/venvs/hvd
    DAGPROF_HOROVOD_VENV=/work/venvs/hvd .venv/bin/python -m pytest -m horovod tests/test_horovod_integration.py
"""
from __future__ import annotations

import os
import sys

import pytest

from dagprof.pipeline import open_run
from dagprof.traces.horovod import TIMELINE, read_timeline

VENV = os.environ.get("DAGPROF_HOROVOD_VENV", "")
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "horovod")

pytestmark = [
    pytest.mark.horovod,
    pytest.mark.skipif(not os.path.exists(os.path.join(VENV, "bin", "horovodrun")),
                       reason="needs Horovod: build it with bench/horovod/build_horovod.sh VENV, then set DAGPROF_HOROVOD_VENV=VENV"),
]


@pytest.mark.parametrize("name", ["fused", "unfused"])
def test_rerecorded_fixture_reads_and_replays(name, tmp_path):
    sys.path.insert(0, BENCH)
    try:
        from record_fixtures import record
    finally:
        sys.path.remove(BENCH)
    folder = record(VENV, name, str(tmp_path))
    tl = read_timeline(os.path.join(folder, TIMELINE))
    assert tl.responses
    assert all(len(r.tensors) == 1 for r in tl.responses) == (name == "unfused")
    p = open_run(folder)
    assert p.run.meta["framework"] == "horovod" and len(p.run.ranks) == 2
    assert abs(p.analysis.error_pct) < 5.0
