"""All-reduce costs for the S-SGD model: OSU latency tables, their fits, and which source wins per worker count."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA as TESTDATA

from dagprof.costmodel import AlphaBeta, preset, ring_allreduce_us
from dagprof.costmodel.osu import read_osu_allreduce
from dagprof.errors import DagprofError
from dagprof.sgd.comm import CommModel

DATA = TESTDATA / "bcaffe-k80-googlenet"


def test_osu_tables():
    for n in (2, 4, 8):
        table = read_osu_allreduce(DATA / f"allreduce{n}.log")
        assert table.workers == n and table.nbytes[0] == 4 and table.nbytes[-1] == 1 << 20
        fit = table.fit(min_bytes=12288)
        big = table.nbytes >= 12288
        model = ring_allreduce_us(table.nbytes[big].astype(float), n, fit)
        assert np.median(np.abs(model / table.latency_us[big] - 1)) < 0.1  # a ring fits the rendezvous range


def test_osu_errors(tmp_path):
    f = tmp_path / "table.log"
    f.write_text("# OSU\n4 10.0\n8 x\n")
    with pytest.raises(DagprofError, match="line 3: expected 'SIZE LATENCY_US'"):
        read_osu_allreduce(f)
    f.write_text("4 10.0\n8 11.0\n")
    with pytest.raises(DagprofError, match="cannot tell the worker count"):
        read_osu_allreduce(f)
    assert read_osu_allreduce(f, workers=3).workers == 3
    f.write_text("2,4 10.0\n2,4 11.0\n")
    with pytest.raises(DagprofError, match="line 2: message sizes must increase"):
        read_osu_allreduce(f)


def test_comm_model_precedence():
    nbytes = np.array([1000, 2000])
    ten = preset("10gbe")
    table_fit = AlphaBeta(100.0, 0.01)
    comm = CommModel(default=ten, default_name="10gbe").with_link(8, table_fit, "osu 8")
    comm = comm.with_measured(4, nbytes, np.array([50.0, 70.0]), "log 4")
    assert comm.layer_us(nbytes, 1).tolist() == [0, 0]
    assert comm.layer_us(nbytes, 4).tolist() == [50, 70]  # measured wins at its worker count
    assert comm.link(4)[1] == "fit of log 4"  # and prices merged messages there
    assert comm.layer_us(nbytes, 8) == pytest.approx(ring_allreduce_us(nbytes.astype(float), 8, table_fit))
    assert comm.link(16)[0] == ten  # the preset covers every other count
    only_tables = CommModel().with_link(8, table_fit, "osu 8").with_link(2, ten, "osu 2")
    assert only_tables.link(16)[1].startswith("osu 8 (measured at 8 workers")
    with pytest.raises(DagprofError, match="no all-reduce cost for 16 workers"):
        CommModel().link(16)
