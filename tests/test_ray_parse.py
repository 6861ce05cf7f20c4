"""``--ray``: rank traces parsed as Ray tasks give the same results as the local process pool.

Ray is an optional extra: the default suite checks only that asking for it without it installed is a
one-line error. The opt-in test (marker ``ray``, ``DAGPROF_RAY_PYTHON`` = a Python that imports ray and
whose path reaches this checkout's dagprof through ``PYTHONPATH``) starts a local single-node Ray and
compares ``analyze --json`` and ``replay --json`` with the local path's, parse cache cold on both.
The two-node check (a worker in its own network namespace) is ``bench/bench_scale.py cluster --ray``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
from testdata import KINETO_CORPUS

from dagprof.cli.main import main
from dagprof.traces.ray_parse import ENV_VAR

DLRM = KINETO_CORPUS / "param" / "dlrm_kineto"
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed here: the opt-in test covers --ray")
def test_ray_missing_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, "")  # restored after the test: --ray sets it for the process
    monkeypatch.setenv("DAGPROF_CACHE_DIR", str(tmp_path))  # cold: the ranks must be parsed
    assert main(["analyze", str(DLRM), "--ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install 'dagprof[ray]'" in err and "\n" not in err


def _cli(python: str, args: list[str], cache: Path, ray: str | None) -> dict:
    env = dict(os.environ, PYTHONPATH=SRC, DAGPROF_CACHE_DIR=str(cache))
    env.pop(ENV_VAR, None)
    cmd = [python, "-m", "dagprof.cli.main", *args, "--json"] + (["--ray", ray] if ray else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture
def python() -> str:
    """The opt-in tests' Python with ray (``DAGPROF_RAY_PYTHON``); skipped without one."""
    python = os.environ.get("DAGPROF_RAY_PYTHON")
    if not python:
        pytest.skip("set DAGPROF_RAY_PYTHON to a Python with ray (pip install 'dagprof[ray]') to check --ray")
    return python


@pytest.mark.ray
def test_ray_parse_matches_local(tmp_path, python):
    for cmd in (["analyze", str(DLRM)], ["replay", str(DLRM), "-o", str(tmp_path / "out")]):
        local = _cli(python, cmd, tmp_path / f"cache-local-{cmd[0]}", None)
        on_ray = _cli(python, cmd, tmp_path / f"cache-ray-{cmd[0]}", "local")  # "local": a fresh single-node Ray for this process
        assert on_ray == local


_DIRECT = r"""
import sys, numpy as np
from dagprof.traces.kineto import read_kineto
from dagprof.traces.kineto_dir import parse_file, trace_files
from dagprof.traces.ray_parse import parse_on_ray
files = trace_files(sys.argv[1])
got = parse_on_ray(files, "local", parse_file, use_cache=False)
assert sorted(got) == files, sorted(got)
for f in files:
    a, b = got[f], read_kineto(f)
    assert (a.rank, a.world_size, a.base_ns, a.events.names, a.lanes, a.groups) == (b.rank, b.world_size, b.base_ns, b.events.names, b.lanes, b.groups), f
    for c in a.events.COLUMNS:
        x = getattr(a.events, c)
        assert x.flags.writeable and np.array_equal(x, getattr(b.events, c)), (f, c)
    assert np.array_equal(a.flows, b.flows) and np.array_equal(a.flow_rule, b.flow_rule), f
print("ok", len(files))
"""


@pytest.mark.ray
def test_parse_on_ray_gives_the_readers_tables(tmp_path, python):
    """Each rank's table from a Ray task equals the reader's own, as ordinary (writable) arrays out of the object store."""
    env = dict(os.environ, PYTHONPATH=SRC, DAGPROF_CACHE_DIR=str(tmp_path))
    done = subprocess.run([python, "-c", _DIRECT, str(DLRM)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and done.stdout.startswith("ok 8"), done.stderr[-2000:]


@pytest.mark.ray
def test_nobody_at_the_address_is_one_line(tmp_path, python):
    env = dict(os.environ, PYTHONPATH=SRC, DAGPROF_CACHE_DIR=str(tmp_path))
    done = subprocess.run([python, "-m", "dagprof.cli.main", "analyze", str(DLRM), "--ray", "127.0.0.1:1"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.strip().endswith("127.0.0.1:1: no Ray cluster answers there (Connection refused)"), done.stderr
