"""``bench/tf_profiler_ab.py``'s arithmetic: a job's window against its own steps before and after it (its pace moves: a
warm-up or an epoch's end shows in a dry window too), and the profiler's cost as the real job's excess less the dry one's."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from tf_profiler_ab import cost_by_pair, excess  # noqa: E402


def rank_file(folder, rank: int, window: range, wall_ms: dict[int, float], cpu_ms: dict[int, float]) -> None:
    ns = {s: int(v * 1e6) for s, v in cpu_ms.items()}
    info = {"step_times_us": {str(s): wall_ms[s] * 1e3 for s in window},
            "unprofiled_step_times_us": {str(s): v * 1e3 for s, v in wall_ms.items() if s not in window},
            "process_cpu_ns": [[s, c] for s, c in ns.items()], "thread_sched_ns": [[s, c // 10, 0] for s, c in ns.items()],
            "named_threads_ns": {"tf_Compute#7": [[s, c // 2, 0, 1] for s, c in ns.items()]}}
    (folder / f"rank{rank}.json").write_text(json.dumps(info))


def test_the_window_is_held_against_each_side_and_the_ranks_cpu_is_summed(tmp_path):
    window = range(6, 10)
    wall = {s: 50.0 for s in range(2)} | {s: 40.0 for s in range(2, 6)} | {s: 44.0 for s in window} | {s: 30.0 for s in range(10, 16)}
    cpu = {s: 20.0 for s in range(2, 6)} | {s: 23.0 for s in window} | {s: 18.0 for s in range(10, 16)} | {0: 90.0, 1: 90.0}
    rank_file(tmp_path, 0, window, wall, cpu)
    rank_file(tmp_path, 1, window, {s: v - 1.0 for s, v in wall.items()}, cpu)
    got = excess(str(tmp_path))
    assert got["window_ms"] == 44.0 and got["outside_ms"] == 30.0  # the slowest rank's; steps 0-1 are the warm-up's
    assert got["step_ms@before"] == pytest.approx(4.0) and got["step_ms@after"] == pytest.approx(14.0)
    assert got["process_cpu_ms@before"] == pytest.approx(6.0) and got["process_cpu_ms@after"] == pytest.approx(10.0)
    assert got["cpu_ms:tf_Compute@before"] == pytest.approx(3.0)  # half the process's, both ranks, the thread's id dropped


def test_the_cost_is_the_real_windows_excess_less_the_dry_ones_pair_by_pair():
    jobs = [{"pair": 0, "mode": "real", "step_ms": 9.0, "exit": [0, 0]}, {"pair": 0, "mode": "dry", "step_ms": 7.0, "exit": [0, 0]},
            {"pair": 1, "mode": "dry", "step_ms": -1.0, "exit": [0, 0]}, {"pair": 1, "mode": "real", "step_ms": 3.0, "exit": [0, 0]},
            {"pair": 2, "mode": "real", "exit": [0, -11]}]  # a crashed job leaves its pair out
    got = cost_by_pair(jobs)
    assert got["step_ms"]["pairs"] == [2.0, 4.0] and got["step_ms"]["median"] == 3.0 and "exit" not in got
