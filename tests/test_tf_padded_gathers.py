"""TF's all-gathers of a sparse gradient in the branch that pads the workers' unequal row counts, sized from every
worker's own count of the ids it looked up (``traces.xplane_run.size_padded_gathers``)."""
import json
import pathlib
import re
import shutil

import numpy as np
from testdata import TF_RECSYS_RAGGED, recsys_logged_ids

from dagprof.traces.events import CommKind, Kind
from dagprof.traces.load import load

RUN = TF_RECSYS_RAGGED
_BRANCH_CALL = re.compile(r"(/(?:then|else))/_\d+/")


def _padded(run) -> dict[tuple[int, int, str], int]:
    """(rank, step, node less its branch call) -> bytes of each all-gather in a ``cond/else/`` branch."""
    out = {}
    for t in run.ranks:
        ev = t.events
        for i in np.flatnonzero((ev.kind == Kind.COMM) & (ev.comm_kind == int(CommKind.ALL_GATHER)) & (ev.step >= 0)).tolist():
            if "/else/" in ev.name_of(i):
                out[(t.rank, int(ev.step[i]), _BRANCH_CALL.sub(r"\1/", ev.name_of(i)))] = int(ev.nbytes[i])
    return out


def test_each_padded_gather_carries_the_most_rows_any_worker_looked_up():
    """``bench/frameworks/tf_recsys_ragged.py``: a ragged history looked up in a context table (32 float32 a row) and,
    with the same ids, a bias table (1 float32), in a custom loop; the workers look up 1100-1500 ids a step, never as
    many, so TF pads each worker's rows and int64 indices to the most any has. Each gather carries 2 x that many rows
    on both workers. Main's collector and reader left the bias table's rows (11 kB, under the memory tracer's floor) and
    indices unsized (2 of the 6 gathers a step); the context table's indices took their count from its rows' allocation."""
    run = load(str(RUN))
    assert not any("have no size" in str(w) for w in run.meta.warnings)
    ids = recsys_logged_ids()
    padded = _padded(run)
    per_row = json.loads((RUN / "rank0.json").read_text())["collective_row_bytes"]
    assert {per_row[name] for (_, _, name) in padded} == {128, 4, 8}  # context rows, bias rows, int64 indices
    steps = {s for (_, s, _) in padded}
    assert len(steps) == 8 and len(padded) == 2 * 8 * 4  # 2 workers, 8 steps, rows and indices of both tables
    for (_, step, name), nbytes in padded.items():
        assert ids[step][0] != ids[step][1]
        assert nbytes == 2 * max(ids[step]) * per_row[name], (step, name)


def _copy(tmp_path: pathlib.Path, strip: tuple[int, ...]) -> pathlib.Path:
    """The recording with ``collective_lookups`` taken out of the given ranks' files (as a collector before 2026-12-05
    wrote them: no lookups for the padding branch, nor for two tables over the same ids)."""
    out = tmp_path / "run"
    shutil.copytree(RUN, out)
    for r in strip:
        f = out / f"rank{r}.json"
        info = json.loads(f.read_text())
        info.pop("collective_lookups")
        f.write_text(json.dumps(info))
    return out


def test_without_the_lookups_the_small_padded_gathers_stay_unsized_and_said(tmp_path):
    """The bias table's rows under the tracer's floor then have no count: 0 B, and a warning counts them."""
    run = load(str(_copy(tmp_path, (0, 1))))
    padded = _padded(run)
    assert sum(b == 0 for b in padded.values()) >= 2 * 8
    assert any("have no size" in str(w) for w in run.meta.warnings)


def test_a_worker_without_its_count_leaves_the_padded_gathers_unsized_and_said(tmp_path):
    """Rank 1's file without its lookups: rank 0's own count alone does not tell the most rows, so neither worker's
    gather of the bias table takes a size from it, and the run's warning says how many were left so."""
    run = load(str(_copy(tmp_path, (1,))))
    padded = _padded(run)
    bias = [b for (_, _, name), b in padded.items() if name.endswith("cond_1/CollectiveGatherV2")]
    assert len(bias) == 16 and not any(bias)
    assert any("padded to the workers' most rows have no size" in str(w) for w in run.meta.warnings)


def test_the_findings_name_the_sparse_gradients_all_gathers():
    """Most of this job's exposed communication is the tables' all-gathers, which the findings called all-reduce."""
    from dagprof.analysis.findings import findings  # noqa: PLC0415
    from dagprof.pipeline import open_run  # noqa: PLC0415

    exposed = [f for f in findings(open_run(str(RUN)).analysis) if f.title == "communication is exposed"]
    assert len(exposed) == 1 and "is all-reduce and sparse-gradient all-gather not hidden" in exposed[0].detail
