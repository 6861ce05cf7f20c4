"""A collective's role (``traces.events.CommRole``) is set by the reader that knows it and read from the graph's ``role``
column by every stage after: DDP's sparse-gradient buckets (Kineto's spans and the comm hooks'), ZeRO-1's parameter
broadcasts (Kineto's and the overlapped step's hooks). Matching across ranks lets a sparse bucket's bytes differ by rank
and still refuses, in one line, a dense bucket whose bytes do."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA, copy_fixture, edit_json

from dagprof.analysis.breakdown import own_collectives
from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.passes.buckets import partition_tensors, sparse_buckets
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import CommRole, Kind
from dagprof.traces.run_schema import Rec

SPARSE = DATA / "ddp-fresh" / "sparse"  # 3 EmbeddingBag(sparse=True): buckets 0-2 gathered, bucket 3 the dense MLPs'
SPARSE_BUCKETS = {0, 1, 2}
ZERO = DATA / "zero1"


def _roles(trace, kind: Kind) -> dict[int, set[int]]:
    """Bucket -> the roles its events of ``kind`` carry."""
    ev = trace.events
    out: dict[int, set[int]] = {}
    for i in np.flatnonzero((ev.kind == kind) & (ev.bucket >= 0)).tolist():
        out.setdefault(int(ev.bucket[i]), set()).add(int(ev.role[i]))
    return out


def _without_kineto(tmp_path):
    run = copy_fixture(tmp_path, "ddp-fresh/sparse")
    for r in (0, 1):
        edit_json(run / f"rank{r}.json", lambda doc: doc.update(kineto_file=""))
    return run


@pytest.mark.parametrize("kineto", [True, False])
def test_the_reader_marks_sparse_buckets_and_the_graph_keeps_it(tmp_path, kineto):
    """Each sparse bucket's transfer and issue are SPARSE on every rank, the dense one's PLAIN, whether Kineto's spans
    (``run_comm.kineto_comm``) or the comm hooks' (``hook_comm``) give the transfers; the graph's issue, join and transfer
    of those buckets carry it, and nothing else does."""
    run = read_run(SPARSE if kineto else _without_kineto(tmp_path))
    assert ("Kineto" in run.ranks[0].meta.comm_source) == kineto
    for t in run.ranks:
        for kind in (Kind.COMM, Kind.COMM_ENQUEUE):
            roles = _roles(t, kind)
            assert roles and all(roles[b] == {CommRole.SPARSE if b in SPARSE_BUCKETS else CommRole.PLAIN} for b in roles)
        assert not (t.events.role[t.events.bucket < 0] != CommRole.PLAIN).any()
    g = build_graph(run)
    assert sparse_buckets(g) == SPARSE_BUCKETS
    marked = g.role == CommRole.SPARSE
    assert set(np.unique(g.kind[marked]).tolist()) == {Kind.COMM, Kind.SYNC, Kind.COMM_ENQUEUE}
    assert set(np.unique(g.bucket[marked]).tolist()) == SPARSE_BUCKETS
    bucketed = np.isin(g.kind, (Kind.COMM, Kind.SYNC, Kind.COMM_ENQUEUE)) & np.isin(g.bucket, list(SPARSE_BUCKETS))
    assert (marked == bucketed).all()
    assert sparse_buckets(partition_tensors(g, 2)) == SPARSE_BUCKETS  # a pass that cuts the transfers keeps their role


@pytest.mark.parametrize("folder, seen", [("kineto", True), ("overlap", True), ("hooks", False)])
def test_the_reader_marks_zeros_broadcasts_and_they_are_not_the_jobs_own(folder, seen):
    """ZeRO's parameter broadcasts are ZERO_PARAMS where they are seen (Kineto's, labelled by ``zero_run.label_zero``; the
    overlapped step's hooks, ``overlap_comm``): as many a step as the record lists, on every rank; without Kineto the
    plain step's are not seen at all. ``breakdown.own_collectives`` leaves them out, by that role."""
    run = read_run(ZERO / folder)
    zero = run.ranks[0].meta.zero
    for t in run.ranks:
        ev = t.events
        ours = (ev.kind == Kind.COMM) & (ev.role == CommRole.ZERO_PARAMS)
        steps = t.meta.steps_profiled
        assert [int(np.count_nonzero(ours & (ev.step == s))) for s in steps] == [len(zero.nbytes) if seen else 0] * len(steps)
        assert all(ev.name_of(i).startswith("broadcast") for i in np.flatnonzero(ours).tolist())
    g = build_graph(run)
    shared = (g.kind == Kind.COMM) & (g.rank < 0) & (g.role == CommRole.ZERO_PARAMS)
    assert int(shared.sum()) == (len(zero.nbytes) * len(g.meta.steps) if seen else 0)
    assert not (own_collectives(g) & shared).any()


def _bytes_on_rank1(run, buckets: set[int]) -> None:
    """Rank 1's recorded bytes of ``buckets``' all-reduces (the comm hook's, ``Rec.ENQ_END``'s x) a tenth larger."""
    def edit(doc):
        seqs = {rec[2] for rec in doc["records"] if rec[0] == Rec.ENQ_BEGIN and rec[1] in buckets}
        for rec in doc["records"]:
            if rec[0] == Rec.ENQ_END and rec[2] in seqs:
                rec[4] = int(rec[4] * 1.1) + 1
    edit_json(run / "rank1.json", edit)


def test_a_sparse_buckets_bytes_may_differ_by_rank(tmp_path):
    """Each rank gathers its own estimate of every rank's rows: rank 1's other bytes are still the same collective."""
    run = copy_fixture(tmp_path, "ddp-fresh/sparse")
    _bytes_on_rank1(run, SPARSE_BUCKETS)
    g = build_graph(read_run(run))
    assert sparse_buckets(g) == SPARSE_BUCKETS


def test_a_dense_buckets_bytes_that_differ_by_rank_are_refused_in_one_line(tmp_path, capsys):
    """The dense bucket's all-reduce of other bytes on rank 1 is no collective rank 0 ran: refused, naming it."""
    run = copy_fixture(tmp_path, "ddp-fresh/sparse")
    _bytes_on_rank1(run, {3})
    with pytest.raises(DagprofError, match=r"mismatched collectives: rank 1: .*allreduce bucket 3") as err:
        build_graph(read_run(run))
    assert "\n" not in str(err.value)
    assert main(["analyze", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mismatched collectives" in err[0] and "allreduce bucket 3" in err[0]
