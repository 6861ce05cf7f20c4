"""The link fitted to overlapping collectives when some carry no bytes: DDP ``join()``'s one-element all-reduces
(tests/data/review6/lstm-join, ``bench/review6/lstm_join.py``)."""
from __future__ import annotations

import json
import shutil

import numpy as np
from testdata import DATA

from dagprof.cli.main import main
from dagprof.graph.build import build_graph
from dagprof.passes.link_fit import fit_link, link_fit, profiled_collectives
from dagprof.traces.dagprof_run import read_run

JOIN = DATA / "review6" / "lstm-join"


def test_overlapping_fit_prices_bytes_from_the_sized_collectives_alone():
    """Two lanes: the 0 B collectives' time is theirs (kept as measured), the sized ones' total over their bytes."""
    nbytes = np.array([0, 0, 1000, 3000], dtype=float)
    dur = np.array([500.0, 300.0, 0.0, 400.0])
    fit = fit_link(nbytes, dur, 2, concurrent=True)
    assert fit.link.beta_us_per_byte == 400.0 / 4000
    assert fit.stalls.tolist() == [500.0, 300.0, 0.0, 0.0]
    priced = fit.link.beta_us_per_byte * nbytes  # 2 ranks: a ring moves each byte once (2(n-1)/n = 1)
    assert priced.sum() + fit.stalls.sum() == dur.sum()  # the total is kept
    alone = fit_link(nbytes[2:], dur[2:], 2, concurrent=True)  # all sized: the plain total, nothing kept
    assert alone.stalls is None and alone.link.beta_us_per_byte == 0.1


def test_join_allreduces_are_no_bandwidth():
    """The recording's 20 join all-reduces of 0 B (10-28 ms of gloo's waiting) no longer set the link's speed, and the
    model of the profiled run is within the 2 % that whatif requires (+18.6 % when they did)."""
    g = build_graph(read_run(JOIN))
    nbytes, dur = profiled_collectives(g, overlapping=True)
    assert g.meta.comm_lanes > 1 and (nbytes == 0).sum() == 20
    fit = link_fit(g)
    assert fit.link.beta_us_per_byte == dur[nbytes > 0].sum() / nbytes[nbytes > 0].sum()
    assert (fit.stalls[nbytes == 0] == dur[nbytes == 0]).all()


def test_join_job_is_predicted(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(JOIN, run)
    assert main(["whatif", str(run), "--bandwidth", "1Gbit", "--no-trace", "--json"]) in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert abs(out["model_error_pct"]) < 2.0


def test_overlapping_fit_keeps_a_stalled_collectives_excess():
    """Two lanes: a tiny collective that waited milliseconds for a late rank (a stock gloo DDP trace's first 128 B buffer
    broadcast, 4.1 ms) is no time per byte; its excess over the others' rate stays on it, the total is kept, and the
    instances at 0 us (their time counted on a partner) flag nothing."""
    nbytes = np.array([128, 92200, 11200, 128, 92200, 11200, 128, 92200, 11200, 92200], dtype=float)
    dur = np.array([4142.0, 3836.0, 15.0, 136.0, 2729.0, 15.0, 106.0, 2910.0, 0.0, 0.0])
    fit = fit_link(nbytes, dur, 2, concurrent=True)
    assert fit.stalls is not None and np.flatnonzero(fit.stalls).tolist() == [0]
    priced = fit.link.beta_us_per_byte * nbytes
    assert np.isclose(priced.sum() + fit.stalls.sum(), dur.sum())
    assert fit.link.beta_us_per_byte == (dur.sum() - 4142.0) / (nbytes.sum() - 128)
    assert "1 outlier(s)' excess stay as measured" in fit.weak
