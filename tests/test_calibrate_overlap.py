"""The compute slowdown beside collectives measured where the user asks for it: ``dagprof calibrate --overlap`` on its own
gloo ranks (never inside the user's job) writes it into the link-model file (version 4), and ``optimize --link-model``
prices a run that measured none by it; without either, the search says the slowdown is not measured."""
from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace

import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.costmodel.alphabeta import AlphaBeta
from dagprof.costmodel.topology import LINK_MODEL_VERSION, read_link_model, save_link_model
from dagprof.errors import DagprofError
from dagprof.pipeline import open_run
from dagprof.search.measured import NOT_MEASURED, overlap_of, slowdown_of
from dagprof.search.optimize import Options, search_run

RUN = DATA / "hybrid-dp-tp-dagprof"  # a gloo DDP job's dagprof profile without overlap.json


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A real 2-rank gloo ``dagprof calibrate --overlap`` (small sweep): its file and its --json answer."""
    out = tmp_path_factory.mktemp("calibrate-overlap") / "link.json"
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        assert main(["calibrate", "--world", "2", "--max-mb", "0.0625", "--iters", "2", "--kinds", "all_gather", "--overlap",
                     "-o", str(out), "--json"]) == 0
    return out, json.loads(said.getvalue())


@pytest.fixture(scope="module")
def prof():
    return open_run(str(RUN))


def test_calibrate_overlap_writes_the_slowdown_into_the_link_model(calibrated):
    out, r = calibrated
    doc = json.loads(out.read_text())
    assert doc["version"] == LINK_MODEL_VERSION and doc["overlap"] == r["overlap"]
    o = doc["overlap"]
    assert o["slowdown"] >= 0 and o["allreduce_bytes"] == 8 * 2**20 and o["allreduce_s"] > 0 and o["matmul_us"] > 0
    assert len(o["samples"]) == 4 and o["format"] == "dagprof-overlap"
    assert o["comm_slowdown"] >= 0  # the other way round: the all-reduce beside the loop, what dagprof sgd prices WFBP's overlap by
    # small all-reduces chained by completion callbacks, as PowerSGD's hook issues them: what each took on these ranks
    assert [b for b, _ in o["chained_allreduce"]] == [4096, 16384, 65536] and all(us > 0 for _, us in o["chained_allreduce"])
    # and with the hook's kind of CPU between them: that CPU's time there per unit of its fastest time alone on the rank
    assert o["chained_stretch"] > 0
    # and the chain of three issued while the calibration's own backward runs on the issuing thread, as a bucket's hook
    # issues PowerSGD's before the last gradient: what each took there
    assert [b for b, _ in o["chained_busy"]] == [4096, 16384, 65536] and all(us > 0 for _, us in o["chained_busy"])
    # the rest of the file reads as before
    assert read_link_model(out).link.bandwidth_bytes_per_s > 0 and [k for k, _ in read_link_model(out).kinds] == ["all_gather"]
    assert read_link_model(out).fsdp is None


def test_optimize_prices_the_overlap_by_the_calibrated_slowdown(calibrated, prof):
    out, _ = calibrated
    m = overlap_of(prof.run, str(out))
    assert m is not None and slowdown_of(prof.run, str(out)) == (m.slowdown, m.allreduce_bytes / m.allreduce_s)
    opts = Options(budget_s=1e6, max_candidates=20, patience=10**6)
    given = search_run(prof.run, prof.graph, replace(opts, link_model=str(out)))
    assert given.overlap_slowdown == m.slowdown and NOT_MEASURED not in given.notes
    alone = search_run(prof.run, prof.graph, opts)
    assert alone.overlap_slowdown == 0.0 and NOT_MEASURED in alone.notes


def test_optimize_cli_takes_the_link_model(calibrated, capsys, tmp_path):
    out, _ = calibrated
    assert main(["optimize", str(RUN), "--link-model", str(out), "--budget", "1", "-o", str(tmp_path / "s"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert NOT_MEASURED not in r["notes"]
    assert main(["optimize", str(RUN), "--budget", "1", "-o", str(tmp_path / "t"), "--json"]) == 0
    assert NOT_MEASURED in json.loads(capsys.readouterr().out)["notes"]


def test_older_and_damaged_link_models(prof, tmp_path):
    """A file before version 4 carries no slowdown (the note says so); a damaged one is refused in one line."""
    v1 = save_link_model(tmp_path / "v1.json", AlphaBeta(50.0, 1e-3), method="test")
    assert overlap_of(prof.run, v1) is None and slowdown_of(prof.run, v1) == (0.0, None)
    bad = save_link_model(tmp_path / "bad.json", AlphaBeta(50.0, 1e-3), overlap={"slowdown": "much"}, method="test")
    with pytest.raises(DagprofError, match="overlap"):
        overlap_of(prof.run, bad)
    # odd figures are refused too, never priced: a negative slowdown (compute sped up beside collectives), and an older
    # file's slowdown per unit of the disturbed loop at 1 or more, which that division cannot give
    fields = {"matmul_us": 200.0, "samples": [], "allreduce_bytes": 8 << 20, "allreduce_s": 0.4}
    for odd in ({"slowdown": -0.3, **fields}, {"slowdown": 1.2, **fields}, {"slowdown": 0.5, **fields, "allreduce_s": -1.0}):
        path = save_link_model(tmp_path / "odd.json", AlphaBeta(50.0, 1e-3), overlap=odd, method="test")
        with pytest.raises(DagprofError, match="overlap"):
            overlap_of(prof.run, path)
    new = save_link_model(tmp_path / "new.json", AlphaBeta(50.0, 1e-3), overlap={"slowdown": 1.2, **fields, "per_undisturbed": True}, method="test")
    assert slowdown_of(prof.run, new) == (1.2, (8 << 20) / 0.4)
