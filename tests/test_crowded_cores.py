"""A what-if that gives ranks profiled on crowded cores more of a core is refused in one line (``passes.crowded_cores``):
the vendored 4-worker Horovod autoencoder ran on the testbed's 2 cores, and its ``--workers 1`` answer (104.8 ms on main)
kept 4 ranks' shared compute; the same job on 1 worker measured 67.2 ms (crf69's kept round answered +576 %)."""
from __future__ import annotations

import shutil

import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.passes.crowded_cores import refuse_uncrowding
from dagprof.pipeline import open_run
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate

CROWDED, WITHIN = DATA / "horovod" / "testbed-autoencoder-w4", DATA / "horovod" / "testbed-autoencoder"


@pytest.fixture(scope="module")
def crowded():
    return open_run(CROWDED).graph


@pytest.mark.parametrize("args", [("--workers", "4,1"), ("--workers", "4,2", "--cores", "2"), ("--cores", "4")])
def test_uncrowding_what_ifs_are_refused_in_one_line(tmp_path, capsys, args):
    run = shutil.copytree(CROWDED, tmp_path / "run")
    assert main(["whatif", str(run), *args, "--no-trace", "--allow-model-error"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(run) in err[0]
    assert "4 ranks shared the 2 cores of host vm when profiled" in err[0] and "cannot uncrowd" in err[0]


def test_what_ifs_that_keep_or_add_crowding_still_answer(crowded):
    assert crowded.meta.host_cpus["vm"].ranks == 4 and crowded.meta.host_cpus["vm"].cores == 2
    for workers, cores, per in ((None, None, None), (4, None, None), (8, None, None), (4, 2, None), (8, 2, 4), (3, 1, None)):
        refuse_uncrowding(crowded, workers, cores, per)
    for workers, cores, per in ((3, None, None), (4, 2, 2), (4, 4, None), (8, 2, 2)):
        with pytest.raises(DagprofError, match="cannot uncrowd"):
            refuse_uncrowding(crowded, workers, cores, per)


def test_the_one_worker_column_is_not_priced_from_crowded_cores(crowded):
    """The scaling columns compare with one worker's step: from a crowded profile that answer is refused, so they are n/a."""
    rows = evaluate(crowded, [Scenario(bandwidth="1Gbit")], tolerance_pct=None)["scenarios"]
    assert rows[0].speedup_vs_one_worker is None and rows[0].predicted_iter_ms > 0


def test_ranks_within_their_cores_answer_one_worker():
    g = open_run(WITHIN).graph
    assert g.meta.host_cpus["vm"].ranks == g.meta.host_cpus["vm"].cores == 2
    row = evaluate(g, [Scenario(workers=1)], tolerance_pct=None)["scenarios"][0]
    assert row.predicted_iter_ms > 0 and row.speedup_vs_one_worker is not None
