"""Ragged profiler windows (real gloo recordings): ranks that profiled different iterations match on the
iterations they share, the rest is trimmed with a warning; only a mismatch inside the shared window is an error."""
from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest
from testdata import GLOO_WINDOWS

from dagprof.align.clocks import align_clocks
from dagprof.align.matching import match_collectives
from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.traces.events import Kind
from dagprof.traces.kineto_dir import read_trace_dir

from gloo_kineto import gloo_traces


def _edited(src, dst, edit) -> str:
    """Copy of a recorded folder with ``edit(rank_file_name, doc)`` applied to each trace."""
    os.makedirs(dst, exist_ok=True)
    for name in sorted(os.listdir(src)):
        if ".json" not in name:
            continue
        opener = gzip.open if name.endswith(".gz") else open
        with opener(os.path.join(src, name), "rt") as f:
            doc = json.load(f)
        edit(name, doc)
        with open(os.path.join(dst, name.removesuffix(".gz")), "w") as f:
            json.dump(doc, f)
    return str(dst)


def _check_consistent(run, m) -> None:
    """What holds for every valid recording: each instance joins both ranks, same collective, same size,
    same (renumbered) step; every collective of a step both ranks profiled is matched."""
    assert not m.problems
    assert m.instances and all(sorted(it.ranks) == [0, 1] for it in m.instances)
    steps = [{int(s) + m.step_offset.get(t.rank, 0) for s in t.step_spans()[:, 0]} for t in run.ranks]
    common = steps[0] & steps[1]
    for p, t in enumerate(run.ranks):
        ev = t.events
        comm = np.flatnonzero((ev.kind == Kind.COMM) & (ev.seq >= 0))
        in_common = np.isin(ev.step[comm] + m.step_offset.get(t.rank, 0), list(common))
        assert np.all(m.instance[p][comm[in_common]] >= 0)  # inside the shared window: all matched
        assert np.all(m.instance[p][comm[~in_common]] == -1)  # outside: trimmed
    for k in range(len(m.instances)):
        views = [(t.events.nbytes[i], t.events.step[i] + m.step_offset.get(t.rank, 0))
                 for p, t in enumerate(run.ranks) for i in np.flatnonzero(m.instance[p] == k)]
        assert len(views) == 2 and views[0] == views[1]


def test_same_window_matches_completely():
    run = read_trace_dir(GLOO_WINDOWS / "same", use_cache=False)
    m = match_collectives(run)
    _check_consistent(run, m)
    assert len(m.instances) == 12 and not m.warnings and not m.step_offset  # 3 iterations x 2 broadcasts + 2 buckets


def test_own_schedule_per_rank_is_trimmed_with_a_warning():
    run = read_trace_dir(GLOO_WINDOWS / "schedules", use_cache=False)  # rank 0: iterations 2-4, rank 1: 3-5
    m = match_collectives(run)
    _check_consistent(run, m)
    assert len(m.instances) == 8 and not m.step_offset
    assert len(m.warnings) == 1 and "rank 0: 4 leading" in m.warnings[0] and "rank 1: 4 trailing" in m.warnings[0]


def test_profiler_started_later_on_one_rank_is_renumbered():
    run = read_trace_dir(GLOO_WINDOWS / "late-start", use_cache=False)  # ProfilerStep#2 on rank 0 is #1 on rank 1
    m = match_collectives(run)
    _check_consistent(run, m)
    assert m.step_offset == {1: 1} and len(m.instances) == 8
    aligned, _ = align_clocks(run)
    assert [sorted(t.step_spans()[:, 0].astype(int).tolist()) for t in aligned.ranks] == [[1, 2, 3], [2, 3, 4]]
    assert any("renumbered" in str(w) for w in aligned.meta.warnings) and any("trailing" in str(w) for w in aligned.meta.warnings)


def test_windows_without_step_markers_are_placed_by_time(tmp_path):
    folder = _edited(GLOO_WINDOWS / "schedules", tmp_path,
                     lambda _, doc: doc.update(traceEvents=[e for e in doc["traceEvents"] if not e.get("name", "").startswith("ProfilerStep")]))
    run = read_trace_dir(folder, use_cache=False)
    m = match_collectives(run)
    assert not m.problems and len(m.instances) == 8 and all(sorted(it.ranks) == [0, 1] for it in m.instances)
    assert "rank 0: 4 leading" in m.warnings[0]


def test_ranks_on_two_hosts_trust_their_step_numbers(tmp_path):
    folder = _edited(GLOO_WINDOWS / "schedules", tmp_path,
                     lambda name, doc: doc.update(host_name="host-b") if name.startswith("rank-1") else None)
    run = read_trace_dir(folder, use_cache=False)
    m = match_collectives(run)
    _check_consistent(run, m)
    assert len(m.instances) == 8


def test_a_collective_lost_inside_the_shared_window_is_an_error(tmp_path):
    def drop_one(name, doc):
        if name.startswith("rank-1"):  # the second all-reduce transfer of iteration 4 (profiled by both)
            steps = [e for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#4"]
            t0, t1 = steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]
            ar = [e for e in doc["traceEvents"] if e.get("name") == "gloo:all_reduce" and t0 <= e["ts"] <= t1]
            doc["traceEvents"].remove(sorted(ar, key=lambda e: e["ts"])[1])
    run = read_trace_dir(_edited(GLOO_WINDOWS / "schedules", tmp_path, drop_one), use_cache=False)
    with pytest.raises(DagprofError) as err:
        match_collectives(run)
    msg = str(err.value)
    assert "\n" not in msg and "mismatched collectives" in msg and "group 0" in msg and "rank" in msg
    m = match_collectives(run, strict=False)
    assert m.problems and len(m.instances) >= 7  # the others still match


def test_the_warning_reaches_the_command_output(capsys, tmp_path):
    assert main(["analyze", str(GLOO_WINDOWS / "schedules"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert any("rank 1: 4 trailing" in w for w in r["warnings"])
    assert main(["analyze", str(GLOO_WINDOWS / "late-start")]) == 0
    out = capsys.readouterr().out
    assert "warning: ProfilerStep numbers count from different iterations" in out


@pytest.mark.parametrize("scenario", ["schedules", "late-start"])
def test_recorded_now(scenario):
    """The same scenarios recorded on this machine with this torch: only what every valid recording satisfies."""
    run = read_trace_dir(gloo_traces(scenario), use_cache=False)
    m = match_collectives(run)
    _check_consistent(run, m)
    assert m.step_offset == ({1: 1} if scenario == "late-start" else {})
    assert m.warnings  # windows differ by construction
