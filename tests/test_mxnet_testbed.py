"""bench/bench_mxnet_ps.py's testbed: every shaped port queues the same bytes at every rate, as a switch's buffer does.

tbf's ``latency 10ms`` queue shrinks with the rate: a 200 Mbit/s port held 2.5x fewer bytes than a 500 Mbit/s one,
dropped the PS exchange's packets (TCP retransmitted 209-566 segments per sender in 8 raw exchanges), and the
bandwidth what-if, which models a lossless link, under-predicted the slower port's jobs."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from dagprof.collect.jobs import netns  # noqa: E402

why = netns.available()
pytestmark = pytest.mark.skipif(why is not None, reason=f"testbed: {why}")


def _limits(c: netns.Cluster) -> set[int]:
    """The queue limit (bytes) of every shaped port, each rank's egress and the bridge's port towards it, to 1 kB
    (tc reports it as the latency it adds at the rate: limit = burst + rate x latency)."""
    out = set()
    for r in range(c.ranks):
        for ns, dev in ((c.ns(r), c.ifname(r)), (f"{c.tag}sw", f"{c.tag}p{r}")):
            text = subprocess.run(["ip", "netns", "exec", ns, "tc", "-j", "qdisc", "show", "dev", dev], capture_output=True, text=True,
                                  check=True).stdout
            opt = json.loads(text)[0]["options"]
            out.add(round((opt["burst"] + opt["rate"] * opt["lat"] / 1e6) / 1e3))
    return out


def test_shaped_ports_queue_the_same_bytes_at_every_rate():
    from bench_mxnet_ps import BUFFER_BYTES, shape

    with netns.Cluster(3, tag="mxt") as c:
        shape(c, 200e6)
        slow = _limits(c)
        shape(c, 500e6)
        fast = _limits(c)
        shape(c, 200e6, buffer_bytes=0)  # tbf's own 10 ms of traffic, as before
        old = _limits(c)
    assert slow == fast == {round(BUFFER_BYTES / 1e3)}
    assert len(old) == 1 and old.pop() < BUFFER_BYTES / 1e3 / 4
