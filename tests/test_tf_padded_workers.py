"""``--workers N`` on TF's all-gathers padded to the workers' most rows (``passes.padded_gathers``), and the framework
overhead on the critical path broken down by what the trace recorded (``analysis.overhead``), on the vendored
``tests/data/tf/recsys-ragged`` (2 workers, steps 8-15, each worker's own rows logged by the script)."""
import re

import numpy as np
import pytest
from testdata import TF_RECSYS_RAGGED, recsys_logged_ids

from dagprof.passes.padded_gathers import expected_most, padded_rows_at
from dagprof.passes.workers import scale_workers
from dagprof.pipeline import open_run
from dagprof.traces.events import CommRole, Kind
from dagprof.traces.xplane_run import padded_key

RUN = TF_RECSYS_RAGGED
_PAD = re.compile(r"(?:^|/)cond(?:_\d+)?/else/")


@pytest.fixture(scope="module")
def prof():
    return open_run(str(RUN))


def _padded(g) -> dict[str, tuple[str, int, int]]:
    """Shared node's name (its instance too) -> (its gather, step, bytes) of every all-gather in a ``cond/else/`` branch."""
    sel = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.role == CommRole.SPARSE))
    return {g.names[g.name[v]]: (padded_key(g.names[g.name[v]]), int(g.step[v]), int(g.nbytes[v])) for v in sel.tolist()
            if _PAD.search(g.names[g.name[v]])}


def _unpadded(g) -> dict[str, int]:
    """The other sparse gradients' all-gathers (equal rows a worker, or the workers' row counts): name -> bytes."""
    sel = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.role == CommRole.SPARSE))
    return {g.names[g.name[v]]: int(g.nbytes[v]) for v in sel.tolist() if not _PAD.search(g.names[g.name[v]])}


def test_the_graph_keeps_each_workers_own_rows_per_step_as_the_script_logged_them(prof):
    """Every padded gather (the two tables' rows and indices) holds both workers' counts in each of the 8 steps,
    the ids each worker's log says it looked up, and the bytes of a row (128, 4, 8)."""
    recs = prof.graph.meta.padded_gathers
    logged = recsys_logged_ids()
    assert len(recs) == 4 and {r.row_bytes for r in recs.values()} == {128, 4, 8}
    for rec in recs.values():
        assert rec.rows == {s: logged[s] for s in range(8, 16)}


def test_expected_most_is_the_empirical_expectation():
    """Exact on small cases: no new worker keeps the step's most; k fresh draws from {1, 3} with the step's most 2 give
    3 unless all k draw 1 (probability 2^-k); fewer workers than profiled keep the first ones' most."""
    pool = np.array([1.0, 3.0])
    assert expected_most([2, 1], pool, 2) == 2
    assert expected_most([2, 1], pool, 3) == pytest.approx(0.5 * 2 + 0.5 * 3)
    assert expected_most([2, 1], pool, 5) == pytest.approx(2 / 8 + 3 * 7 / 8)
    assert expected_most([1, 2], pool, 1) == 1
    assert expected_most([5, 4], pool, 9) == 5  # the pool never beats the step's own most


def test_workers_whose_rows_never_differed_keep_the_steps_count():
    """Counts that change from step to step but never between the workers (a padded batch split between them) are no
    independent draws: 4 workers send the step's count, where counts that differed draw from the pool."""
    from dagprof.traces.meta import PaddedGather  # noqa: PLC0415

    tied = PaddedGather(8, {1: [100, 100], 2: [300, 300]})
    assert padded_rows_at(tied, 1, 4) == 100 and padded_rows_at(tied, 2, 16) == 300 and padded_rows_at(tied, -1, 4) == 200
    apart = PaddedGather(8, {1: [100, 300], 2: [300, 300]})
    assert padded_rows_at(apart, 2, 4) == 300 and padded_rows_at(apart, 1, 3) == pytest.approx(300)
    assert padded_rows_at(PaddedGather(8, {1: [100, 200], 2: [300, 300]}), 1, 3) == pytest.approx(200 * 0.25 + 300 * 0.5 + 200 * 0.25)


def test_more_workers_pad_to_the_most_of_more_draws(prof):
    """Each padded gather on N workers carries N x the expected most rows: at N = 2 as profiled, byte for byte; at 4 and
    16 more than N / 2 times the profiled bytes (the most of more workers' rows) and never more than N x the most any
    worker looked up in the window; one worker sends its own rows (rank 0's). The other sparse gathers scale by N / 2."""
    g = prof.graph
    base = _padded(g)
    logged = recsys_logged_ids()
    most = max(max(v) for v in logged.values())
    assert len(base) == 32 and all(b > 0 for _, _, b in base.values())
    assert _padded(scale_workers(g, 2)) == base
    recs = g.meta.padded_gathers
    for n in (4, 16):
        h = scale_workers(g, n)
        scaled = _padded(h)
        assert len(scaled) == len(base)
        got = sum(b for _, _, b in scaled.values())
        assert got > n / 2 * sum(b for _, _, b in base.values())
        for v, (key, step, b) in scaled.items():
            assert n / 2 * base[v][2] <= b <= n * most * recs[key].row_bytes, (key, step)
        other, scaled_other = _unpadded(g), _unpadded(h)
        assert other and scaled_other == {k: n // 2 * b for k, b in other.items()}
    one = _padded(scale_workers(g, 1))
    for key, step, b in one.values():
        assert b == logged[step][0] * recs[key].row_bytes


def test_the_overhead_on_the_critical_path_is_broken_down_by_what_the_trace_recorded(prof):
    """The parts add up to the path's framework overhead; the rank that began the window late, the collectives' starts and
    the dataset iterator between steps (``IteratorGetNext``, an eager op on the main thread) are named; `analyze` prints
    them under the overhead line and `--json` carries them."""
    from dagprof.cli.cmd_analyze import to_text  # noqa: PLC0415

    path = prof.analysis.path
    parts = path.overhead
    assert sum(parts.values()) == pytest.approx(path.by_category["framework overhead"], rel=1e-9)
    assert "a rank began the window later than the first" in parts
    assert "a collective's start after its last rank joined" in parts
    assert "between steps: eager op IteratorGetNext" in parts
    d = prof.to_dict()
    assert d["critical_path_per_iter"]["overhead_ms"]["between steps: eager op IteratorGetNext"] > 0
    text = to_text(d)
    head = text.index("  framework overhead")
    assert text.index("between steps: eager op IteratorGetNext", head) < text.index("  communication ", head)
