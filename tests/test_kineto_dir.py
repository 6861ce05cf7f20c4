"""A folder of rank traces: parallel parse, cache beside the traces (or in $TMPDIR when read-only), rank bookkeeping."""
from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
import pytest

from dagprof.errors import DagprofError
from dagprof.traces import cache
from dagprof.traces.kineto_dir import read_trace_dir

from gloo_kineto import gloo_traces


@pytest.fixture
def folder(tmp_path, monkeypatch):
    traces = tmp_path / "traces"
    traces.mkdir()
    for f in glob.glob(f"{gloo_traces()}/*.json"):
        shutil.copy(f, traces / os.path.basename(f))
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "cache"))  # this test's own cache folder
    return traces


def _cache_files(folder):
    return sorted(glob.glob(str(folder.parent / "cache" / "*.parse")))


def _same(a, b):
    assert a.rank == b.rank and a.base_ns == b.base_ns and a.groups == b.groups and a.lanes == b.lanes
    for c in a.events.COLUMNS:
        assert np.array_equal(getattr(a.events, c), getattr(b.events, c)), c
    assert a.events.names == b.events.names and np.array_equal(a.flows, b.flows)
    assert a.meta == b.meta and a.group_ranks == b.group_ranks


def test_parallel_parse_then_cache_hit_is_identical(folder):
    cold = read_trace_dir(folder, jobs=2)
    assert [t.rank for t in cold.ranks] == [0, 1] and cold.meta.missing_ranks == []
    assert len(_cache_files(folder)) == 2
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


def test_cache_goes_to_the_user_cache_dir_not_beside_the_traces(folder, monkeypatch, tmp_path_factory):
    home = tmp_path_factory.mktemp("cachehome")
    before = set(os.listdir(folder))
    monkeypatch.delenv(cache.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg"))
    assert cache.cache_dir() == str(home / "xdg" / "dagprof")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: relative paths are invalid
    monkeypatch.setenv("HOME", str(home))
    assert cache.cache_dir() == str(home / ".cache" / "dagprof")
    mine = home / "mine"
    monkeypatch.setenv(cache.ENV_VAR, str(mine))
    read_trace_dir(folder)
    assert set(os.listdir(folder)) == before  # nothing beside the user's traces
    assert len(glob.glob(str(mine / "*.parse"))) == 2
    assert read_trace_dir(folder).ranks[0].source.startswith(str(folder))


def test_unwritable_cache_dir_falls_back_to_tmp(folder, monkeypatch, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tmpdir")
    monkeypatch.setattr(cache.tempfile, "gettempdir", lambda: str(tmp))
    blocker = tmp_path_factory.mktemp("blocked") / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cache.ENV_VAR, str(blocker / "cache"))  # under a regular file: cannot be created, even as root
    before = set(os.listdir(folder))
    read_trace_dir(folder)
    assert set(os.listdir(folder)) == before
    assert len(glob.glob(str(tmp / f"dagprof-cache-{os.geteuid()}" / "*.parse"))) == 2  # a folder of this user's own
    assert cache.load_cached(sorted(glob.glob(str(folder / "rank-0*.json")))[0]) is not None


def test_duplicate_rank_and_foreign_json(folder):
    (folder / "replay.trace.json").write_text(json.dumps({"traceEvents": [], "displayTimeUnit": "ms", "metadata": {}}))
    run = read_trace_dir(folder, use_cache=False)
    assert list(run.meta.skipped) == ["replay.trace.json"] and len(run.ranks) == 2
    src = sorted(glob.glob(str(folder / "rank-0*.json")))[0]
    shutil.copy(src, folder / "rank-0.copy.json")
    with pytest.raises(DagprofError, match="rank 0 appears twice") as err:
        read_trace_dir(folder, use_cache=False)
    assert "\n" not in str(err.value)


def test_missing_ranks_are_reported(folder):
    os.remove(sorted(glob.glob(str(folder / "rank-1*.json")))[0])
    run = read_trace_dir(folder, use_cache=False)
    assert run.meta.missing_ranks == [1] and [t.rank for t in run.ranks] == [0]


def test_empty_folder(tmp_path):
    with pytest.raises(DagprofError, match="no torch.profiler traces"):
        read_trace_dir(tmp_path)


def test_a_damaged_cache_file_is_a_miss(folder):
    cold = read_trace_dir(folder, jobs=1)
    for i, c in enumerate(_cache_files(folder)):
        data = open(c, "rb").read()
        open(c, "wb").write(data[: len(data) // 2] if i == 0 else b"")  # cut short; emptied
    warm = read_trace_dir(folder, jobs=1)
    for a, b in zip(cold.ranks, warm.ranks):
        _same(a, b)
    assert all(cache.load_cached(t.source) is not None for t in warm.ranks)  # rewritten
