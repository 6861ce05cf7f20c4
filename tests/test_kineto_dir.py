"""A folder of rank traces: parallel parse, cache beside the traces (or in $TMPDIR when read-only), rank bookkeeping."""
from __future__ import annotations

import glob
import json
import os
import shutil
import stat

import numpy as np
import pytest

from dagprof.errors import DagprofError
from dagprof.traces import cache
from dagprof.traces.kineto_dir import read_trace_dir

from gloo_kineto import gloo_traces


@pytest.fixture
def folder(tmp_path):
    for f in glob.glob(f"{gloo_traces()}/*.json"):
        shutil.copy(f, tmp_path / os.path.basename(f))
    return tmp_path


def _same(a, b):
    assert a.rank == b.rank and a.base_ns == b.base_ns and a.groups == b.groups and a.lanes == b.lanes
    for c in a.events.COLUMNS:
        assert np.array_equal(getattr(a.events, c), getattr(b.events, c)), c
    assert a.events.names == b.events.names and np.array_equal(a.flows, b.flows)
    assert a.meta == b.meta and a.group_ranks == b.group_ranks


def test_parallel_parse_then_cache_hit_is_identical(folder):
    cold = read_trace_dir(folder, jobs=2)
    assert [t.rank for t in cold.ranks] == [0, 1] and cold.meta["missing_ranks"] == []
    assert len(glob.glob(str(folder / cache.CACHE_DIR / "*.npz"))) == 2
    warm = read_trace_dir(folder)
    for a, b in zip(cold.ranks, warm.ranks):
        _same(a, b)
        assert b.source == a.source  # the trace, not the cache file


def test_cache_is_invalidated_when_the_trace_changes(folder):
    read_trace_dir(folder)
    f = sorted(glob.glob(str(folder / "rank-1*.json")))[0]
    doc = json.load(open(f))
    doc["baseTimeNanoseconds"] += 5_000_000
    open(f, "w").write(json.dumps(doc))
    os.utime(f, ns=(os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns + 1_000_000_000))
    assert cache.load_cached(f) is None
    run = read_trace_dir(folder)
    fresh = read_trace_dir(folder, use_cache=False)
    assert run.ranks[1].base_ns == fresh.ranks[1].base_ns


def test_read_only_folder_caches_in_tmp(folder, monkeypatch, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tmpdir")
    monkeypatch.setattr(cache.tempfile, "gettempdir", lambda: str(tmp))
    mode = os.stat(folder).st_mode
    os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR)
    try:
        read_trace_dir(folder)
        assert not os.path.exists(folder / cache.CACHE_DIR)  # even as root: the mode bits are respected
        assert len(glob.glob(str(tmp / "dagprof-cache" / "*.npz"))) == 2
        assert read_trace_dir(folder).ranks[0].rank == 0
    finally:
        os.chmod(folder, mode)


def test_duplicate_rank_and_foreign_json(folder):
    (folder / "replay.trace.json").write_text(json.dumps({"traceEvents": [], "displayTimeUnit": "ms", "metadata": {}}))
    run = read_trace_dir(folder, use_cache=False)
    assert list(run.meta["skipped"]) == ["replay.trace.json"] and len(run.ranks) == 2
    src = sorted(glob.glob(str(folder / "rank-0*.json")))[0]
    shutil.copy(src, folder / "rank-0.copy.json")
    with pytest.raises(DagprofError, match="rank 0 appears twice") as err:
        read_trace_dir(folder, use_cache=False)
    assert "\n" not in str(err.value)


def test_missing_ranks_are_reported(folder):
    os.remove(sorted(glob.glob(str(folder / "rank-1*.json")))[0])
    run = read_trace_dir(folder, use_cache=False)
    assert run.meta["missing_ranks"] == [1] and [t.rank for t in run.ranks] == [0]


def test_empty_folder(tmp_path):
    with pytest.raises(DagprofError, match="no torch.profiler traces"):
        read_trace_dir(tmp_path)


def test_a_damaged_cache_file_is_a_miss(folder):
    cold = read_trace_dir(folder, jobs=1)
    for i, c in enumerate(sorted(glob.glob(str(folder / cache.CACHE_DIR / "*.npz")))):
        data = open(c, "rb").read()
        open(c, "wb").write(data[: len(data) // 2] if i == 0 else b"")  # cut short; emptied
    warm = read_trace_dir(folder, jobs=1)
    for a, b in zip(cold.ranks, warm.ranks):
        _same(a, b)
    assert all(cache.load_cached(t.source) is not None for t in warm.ranks)  # rewritten
