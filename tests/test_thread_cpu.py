"""A Horovod rank's other threads' CPU against its collectives' wall time (``bench/horovod/thread_cpu.py``), on the fixed
pair of testbed jobs of hvd_lstm_lm (``tests/data/horovod/pinned-quiet`` at 1 Gbit/s, ``pinned-200M`` the same round's job
at 200 Mbit/s; each rank pinned alone to a core): outside the profiled window the other threads' CPU a step stays as it
was while the collectives' wall time grows fourfold; in the window rank 0's grows with it (Horovod's timeline, which rank 0
alone writes), rank 1's does not."""
from __future__ import annotations

import json
import os
import sys

import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "horovod"))

from thread_cpu import job_cpu, kept_pairs, main  # noqa: E402

QUIET, SLOW = DATA / "horovod" / "pinned-quiet", DATA / "horovod" / "pinned-200M"


@pytest.fixture
def kept(tmp_path):
    os.symlink(QUIET, tmp_path / "tb-hvd_lstm_lm-0-1000M")
    os.symlink(SLOW, tmp_path / "tb-hvd_lstm_lm-0-200M")
    (tmp_path / "tb-hvd_lstm_lm-pair.json").write_text(json.dumps({"rate_bit": 1e9, "other_rate_bit": 200e6, "hosts": True}))
    return tmp_path


def test_every_rank_has_its_steps_split_at_the_window():
    ranks = job_cpu(str(QUIET))
    assert set(ranks) == {0, 1}
    for x in ranks.values():
        assert 0 < x.comm_wall < x.step_in and 0 < x.compute < x.step_in
        assert x.others_out >= 0 and x.others_in >= 0 and x.step_out > 0
        assert x.outside_comm > 0


def test_the_other_threads_cpu_is_no_rate_of_the_collectives_time_outside_the_window(kept):
    pairs = kept_pairs(str(kept))
    assert list(pairs) == [("hvd_lstm_lm", 0)]
    ranks = pairs[("hvd_lstm_lm", 0)]
    assert set(ranks) == {0, 1}
    for p in ranks.values():
        assert p.comm_change > 100.0  # ms a step: 42 -> 179
        assert abs(p.per_comm_ms(inside=False)) < 0.15  # -0.01 / -0.10 ms of CPU per ms of collective
    # in the window rank 0's other threads (its timeline writer among them) take 0.42 ms per ms of collective, rank 1's none
    assert ranks[0].per_comm_ms(inside=True) > 0.3
    assert ranks[0].per_comm_ms(inside=True) - ranks[1].per_comm_ms(inside=True) > 0.3


def test_the_command_prints_a_row_per_round_and_rank(kept, capsys):
    assert main(["--pairs", str(kept)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "hvd_lstm_lm" in line]
    assert len(rows) == 2


def test_a_file_beside_the_jobs_is_said_in_one_line(kept, capsys):
    assert main([str(kept / "tb-hvd_lstm_lm-pair.json"), str(kept / "tb-hvd_lstm_lm-0-200M")]) == 1
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "tb-hvd_lstm_lm-pair.json" in err and "Traceback" not in err
    assert len([line for line in out.splitlines() if "tb-hvd_lstm_lm-0-200M" in line]) == 2


def test_a_pair_file_without_its_rates_is_said_in_one_line(kept, capsys):
    (kept / "tb-hvd_lstm_lm-pair.json").write_text(json.dumps({"rate_bit": 1e9}))
    assert main(["--pairs", str(kept)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "tb-hvd_lstm_lm-pair.json" in err and "other_rate_bit" in err
