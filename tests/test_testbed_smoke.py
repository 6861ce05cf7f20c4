"""The emulated-cluster testbed end to end on tiny cells: namespaces, tc, real gloo DDP ranks,
dagprof profiling, a link sweep, what-if predictions, and complete clean-up.
(bench/testbed/run.py runs the full grid.)"""
import argparse
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "testbed"))

from dagprof.collect.jobs import netns  # noqa: E402

why = netns.available()
pytestmark = pytest.mark.skipif(why is not None, reason=f"testbed: {why}")


def namespaces() -> set[str]:
    """This process's namespaces (the testbed names them dpt<pid>...): other jobs on the machine may make their own."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    mine = re.compile(rf"dpt{os.getpid() % 100000}(r\d+|sw)")
    return {line.split()[0] for line in out.splitlines() if line.strip() and mine.fullmatch(line.split()[0])}


def test_one_tiny_round(tmp_path):
    import run

    before = namespaces()
    args = argparse.Namespace(warmup=1, steps=2, profile_steps=3, profile_margin=0, batch=4, width=64, depth=2, cores=2,
                              ranks=[2], rates=["1Gbit", "200Mbit"], caps=(1.0,), profiled=(2, "1Gbit", 1.0), swept="unlimited",
                              repredict=None, calibrated={})
    import random

    measured, predicted, _ = run.one_round(args, str(tmp_path), random.Random(0))  # (cells, predictions, their intervals)
    assert sorted(measured) == [(2, "1Gbit", 1.0), (2, "200Mbit", 1.0)]
    assert all(len(v) == 2 and min(v) > 0 for v in measured.values())
    assert all(predicted[k] > 0 for k in measured) and predicted["replay"] > 0
    assert os.path.exists(tmp_path / "r2" / "run" / "manifest.json")
    again = argparse.Namespace(**{**vars(args), "repredict": str(tmp_path)})  # --repredict: the kept round, nothing run
    remeasured, repredicted, _ = run.one_round(again, str(tmp_path), random.Random(1))
    assert remeasured == measured and all(repredicted[k] == pytest.approx(predicted[k]) for k in measured)
    assert namespaces() == before


def test_cluster_cleans_up_on_failure():
    before = namespaces()
    with pytest.raises(RuntimeError):
        with netns.Cluster(2) as c:
            assert len(namespaces() - before) == 3
            c.set_rate(1e9)
            raise RuntimeError("boom")
    assert namespaces() == before
