"""``bench/gloo_wakeups.py`` on the vendored 1x2 HSDP dual encoder profiled at 1 Gbit/s (``fsdp-fresh/dual-1x2-1gbit``, which
recorded its threads per step): per rank the gloo threads' CPU and wake-ups as recorded, a wake-up's share of them, and the wire's
time at the rate asked, so that the wake-ups per ms of it halve when the rate doubles (no timing)."""
from __future__ import annotations

import os
import statistics
import sys

import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import gloo_wakeups  # noqa: E402

from dagprof.pipeline import open_run  # noqa: E402

RUN = DATA / "fsdp-fresh" / "dual-1x2-1gbit"


def test_each_rank_s_wakeups_are_its_recorded_threads_and_follow_the_wire():
    loop = open_run(str(RUN)).graph.meta.loop_steps
    at_1g, at_2g = gloo_wakeups.wakeups(str(RUN), 125e6), gloo_wakeups.wakeups(str(RUN), 250e6)
    assert sorted(at_1g) == sorted(loop.profiled) == [0, 1]
    for r, x in at_1g.items():
        others = [loop.sched[r][s].others for s in loop.profiled[r]]
        assert x["runs"] == statistics.median(o.runs for o in others)
        assert x["cpu_per_run_us"] == pytest.approx(sum(o.cpu_us for o in others) / sum(o.runs for o in others))
        assert x["wire_ms"] > 0
        assert at_2g[r]["wire_ms"] == pytest.approx(x["wire_ms"] / 2)
        assert at_2g[r]["runs_per_wire_ms"] == pytest.approx(2 * x["runs_per_wire_ms"])
