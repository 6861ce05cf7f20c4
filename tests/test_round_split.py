"""A testbed round's what-if error split by critical-path category (``bench/horovod/round_split.py``), on the stored pair
of hvd_sparse_gru (tests/data/horovod/testbed-sparse-gru: one round's jobs at 500 and 200 Mbit/s) laid out as
``bench_frameworks.py --testbed --keep`` keeps a round: its what-if is the one the bench judges (``predict_rate``), the
model reproduces the profiled job, and the last columns are the differences they say."""
from __future__ import annotations

import json
import os
import sys

import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "horovod"))

from round_split import jobs, main, split  # noqa: E402
from shaped_loopback import predict_rate  # noqa: E402

from dagprof.pipeline import open_run  # noqa: E402

PAIR = DATA / "horovod" / "testbed-sparse-gru"


@pytest.fixture
def kept(tmp_path):
    for rate in ("500M", "200M"):
        os.symlink(PAIR / rate, tmp_path / f"tb-hvd_sparse_gru-0-{rate}")
    (tmp_path / "tb-hvd_sparse_gru-pair.json").write_text(json.dumps({"rate_bit": 500e6, "other_rate_bit": 200e6, "why": "given", "hosts": False}))
    return tmp_path


def test_the_split_prices_the_benchs_what_if_and_its_model_reproduces_the_profile(kept, capsys):
    graphs = jobs(str(kept), "hvd_sparse_gru", 0)
    assert set(graphs) == {"A", "model", "P", "B"}  # no reference jobs kept with this pair
    rows = {col: split(g) for col, g in graphs.items()}
    judged = predict_rate(str(kept / "tb-hvd_sparse_gru-0-500M"), 500e6, 200e6)
    assert rows["P"]["median step"] == pytest.approx(judged["predicted_median_ms"])
    assert rows["P"]["collectives"] == pytest.approx(judged["predicted_comm_ms"])
    assert rows["model"]["median step"] == pytest.approx(judged["model_median_ms"])
    assert rows["model"]["path"] == pytest.approx(rows["A"]["path"], rel=0.03)
    assert rows["P"]["collectives"] > 1.5 * rows["A"]["collectives"]
    for r in rows.values():  # the categories add up to the path
        assert sum(v for k, v in r.items() if k not in ("path", "median step", "collectives", "peer waits")) == pytest.approx(r["path"], rel=1e-6)
    assert main([str(kept), "hvd_sparse_gru", "0"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("collectives"))
    *_, p_less_b, change = (float(v) for v in line.split()[1:])
    assert p_less_b == pytest.approx(rows["P"]["collectives"] - rows["B"]["collectives"], abs=0.1)
    assert change == pytest.approx((rows["P"]["collectives"] - rows["model"]["collectives"]) - (rows["B"]["collectives"] - rows["A"]["collectives"]), abs=0.1)


def test_peer_waits_are_the_recorded_waits_for_a_peer_still_receiving():
    """tests/data/horovod/pinned-200M kept every rank's Horovod trace log: the row is rank 0's negotiations' waits for a
    peer still in the previous response (``HorovodRecord.peer_waits``), per step; a recording without logs has none."""
    g = open_run(str(DATA / "horovod" / "pinned-200M")).graph
    waits = g.meta.horovod.peer_waits
    assert len(waits) > 0
    steps = len({int(s) for s in g.step if s >= 0})
    assert split(g)["peer waits"] == pytest.approx(sum(w.us for w in waits) / steps / 1e3, rel=1e-9)
    assert split(open_run(str(PAIR / "200M")).graph)["peer waits"] == 0.0
