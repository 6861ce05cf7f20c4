"""The emulated-cluster testbed end to end on tiny cells: namespaces, tc, real gloo DDP ranks,
dagprof profiling, a link sweep, what-if predictions, and complete clean-up.
(bench/testbed/run.py runs the full grid.)"""
import argparse
import json
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
    with open(tmp_path / "r2" / "dropped.json") as f:  # every phase's lost packets, read from the shaped ports
        dropped = json.load(f)
    assert len(dropped) == 4 and all(d["dropped_packets"] is not None for d in dropped)
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


# One TCP stream of 4 MB from rank 1 to rank 0 (through rank 1's shaped egress).
_STREAM = """
import os, socket, time
port, n = int(os.environ["MASTER_PORT"]), 4 << 20
if os.environ["RANK"] == "0":
    srv = socket.create_server(("0.0.0.0", port)); c = srv.accept()[0]; got = 0
    while got < n and (b := c.recv(1 << 20)):
        got += len(b)
    c.sendall(b"k")
else:
    for _ in range(200):
        try:
            s = socket.create_connection((os.environ["MASTER_ADDR"], port)); break
        except OSError:
            time.sleep(0.05)
    s.sendall(bytes(n)); s.recv(1)
"""


def _queue_kb(c: netns.Cluster) -> set[int]:
    """Each rank's egress queue limit in kB (tc reports it as the latency it adds: limit = burst + rate x latency)."""
    out = set()
    for r in range(c.ranks):
        text = subprocess.run(["ip", "netns", "exec", c.ns(r), "tc", "-j", "qdisc", "show", "dev", c.ifname(r)], capture_output=True,
                              text=True, check=True).stdout
        opt = json.loads(text)[0]["options"]
        out.add(round((opt["burst"] + opt["rate"] * opt["lat"] / 1e6) / 1e3))
    return out


def test_a_cluster_can_keep_the_old_ten_ms_queue_for_comparisons():
    """``buffer_bytes=0`` (``bench_optimize.py --buffer-kb 0``): tbf's ``latency 10ms``, the queue before BUFFER_BYTES, so an
    interleaved A/B of the two queues runs from the repository: 10 ms at 200 Mbit/s plus the 1 ms bucket, 275 kB."""
    with netns.Cluster(2, buffer_bytes=0) as c:
        c.set_rate(200e6)
        assert _queue_kb(c) == {275}


def test_shaped_ports_queue_a_buffer_and_count_their_drops(tmp_path, capsys):
    """Issue 20: tbf's ``latency 10ms`` queue dropped DDP's packets at 200 Mbit/s (TCP then stalls a step ~200 ms); each port now
    queues BUFFER_BYTES at every rate, and the packets a port still drops are read per job and warned about with a count."""
    before = namespaces()
    argv = [sys.executable, "-c", _STREAM]
    with netns.Cluster(2) as c:
        for rate in (1e9, 200e6):
            c.set_rate(rate)
            assert _queue_kb(c) == {round(netns.BUFFER_BYTES / 1e3)}
        shaped = netns.run_ranks(argv, 2, str(tmp_path / "shaped"), cluster=c, timeout_s=300)
        assert shaped.per_rank is not None and len(shaped.per_rank) == 2 and c.dropped == [shaped]
        for r in range(2):  # a port with room for 20 frames: a lossy link
            subprocess.run(["ip", "netns", "exec", c.ns(r), "tc", "qdisc", "replace", "dev", c.ifname(r), "root", "tbf", "rate", "200mbit",
                            "burst", "25000", "limit", "30000"], check=True)
        lossy = netns.run_ranks(argv, 2, str(tmp_path / "lossy"), cluster=c, timeout_s=300)
        assert lossy.per_rank[1] > 0 and c.dropped == [shaped, lossy]
        assert f"dropped {lossy.total:,} packets" in capsys.readouterr().err
    assert namespaces() == before
