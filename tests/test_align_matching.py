"""Collectives matched across ranks: exact on consistent traces, honest (reported) on sampled or broken ones."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from testdata import KINETO_PUBLIC as DATA

from dagprof.align.matching import match_collectives
from dagprof.errors import DagprofError
from dagprof.traces.events import CommKind, Kind, Run
from dagprof.traces.kineto_dir import read_trace_dir

from gloo_kineto import gloo_traces
from synthetic import ddp_run


def test_own_gloo_run_matches_completely():
    run = read_trace_dir(gloo_traces())
    m = match_collectives(run)
    assert not m.problems and m.instances
    assert all(sorted(it.ranks) == [0, 1] for it in m.instances)
    assert {it.kind for it in m.instances} == {CommKind.ALL_REDUCE, CommKind.BROADCAST}
    for p, t in enumerate(run.ranks):  # every transfer got its instance
        comm = np.flatnonzero(t.events.kind == Kind.COMM)
        assert np.all(m.instance[p][comm] >= 0)
    assert len(m.complete(2)) == len(m.instances)


def _drop_comm(run: Run, rank_pos: int, which: int) -> Run:
    """Rank loses one transfer, as a sampled trace does (reader counted seq without it)."""
    t = run.ranks[rank_pos]
    ev = t.events
    comm = np.flatnonzero(ev.kind == Kind.COMM)
    kind, seq = ev.kind.copy(), ev.seq.copy()
    kind[comm[which]] = Kind.OTHER
    later = comm[which + 1:]
    seq[later] -= 1
    seq[comm[which]] = -1
    events = dataclasses.replace(ev, kind=kind, seq=seq)
    ranks = list(run.ranks)
    ranks[rank_pos] = dataclasses.replace(t, events=events)
    return Run(ranks, source=run.source)


def test_lost_collective_is_reported_and_the_rest_still_match():
    run = _drop_comm(ddp_run(ranks=3, steps=2), 1, 1)
    with pytest.raises(DagprofError) as err:
        match_collectives(run)
    assert "missing on rank(s) [1]" in str(err.value) and "\n" not in str(err.value)
    m = match_collectives(run, strict=False)
    assert len(m.problems) == 1
    full = [it for it in m.instances if len(it.ranks) == 3]
    assert len(full) == len(m.instances) - 1  # positional matching would have shifted every later one


def test_size_mismatch_names_rank_and_position():
    run = ddp_run(ranks=2, steps=1)
    t = run.ranks[1]
    nbytes = t.events.nbytes.copy()
    comm = np.flatnonzero(t.events.kind == Kind.COMM)
    nbytes[comm[0]] = 8
    run.ranks[1] = dataclasses.replace(t, events=dataclasses.replace(t.events, nbytes=nbytes))
    m = match_collectives(run, strict=False)
    assert any(p.startswith("rank 1:") and "8 B" in p for p in m.problems)


def test_explicit_seq_is_authoritative():
    run = ddp_run(ranks=2, steps=2)
    for t in run.ranks:
        t.meta.explicit_seq = True
    run = _drop_comm(run, 1, 0)
    t = run.ranks[1]  # explicit Seq values do not shift when an event is lost
    seq = t.events.seq.copy()
    comm = np.flatnonzero(t.events.kind == Kind.COMM)
    seq[comm] += 1
    run.ranks[1] = dataclasses.replace(t, events=dataclasses.replace(t.events, seq=seq))
    m = match_collectives(run, strict=False)
    assert sum(len(it.ranks) == 2 for it in m.instances) == len(comm)


def test_sampled_job_ranks_partly_match_and_report_the_rest():
    run = read_trace_dir(f"{DATA}/trace_filter")
    with pytest.raises(DagprofError, match="mismatched collectives"):
        match_collectives(run)
    m = match_collectives(run, strict=False)
    both = [it for it in m.instances if sorted(it.ranks) == [0, 1]]
    assert len(both) >= 4 and m.problems
    assert all(it.kind in (CommKind.ALL_REDUCE, CommKind.ALL_GATHER, CommKind.ALL_TO_ALL) for it in both)
