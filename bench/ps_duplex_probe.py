"""Raw TCP on the MXNet testbed's shaped ports, without MXNet: does a server's port carry a push in at full rate while
it sends a pull out?

A parameter server's exchange pushes into its port while it answers other workers' pulls out of it (a worker that began
its step early). ``graph.collectives.add_ps_part`` gives the port's two directions a device each, so the push crosses at
the link's rate whatever leaves. On the testbed (``bench_mxnet_ps.shape``: tbf both ways with a 2 MB queue) the
push's TCP acknowledgements leave the server through the same queue as the pull's data and wait behind it. Node 0 is
the server, node 1 a worker pulling, node 2 a worker pushing; per trial, alternately, worker 2 pushes ``--push-mb``
alone, or while the server sends ``--pull-mb`` to worker 1 from the same instant. Printed: the push's time alone and
beside the pull, medians over the trials, against the payload rate.

    dp-excl .venv/bin/python bench/ps_duplex_probe.py [--rates 200e6,1e9] [--trials 8]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from bench_mxnet_ps import BURST_MS, PAYLOAD, shape

from dagprof.collect.jobs.netns import BUFFER_BYTES, Cluster

_SERVER = """
import json, socket, sys, threading, time
push, pull, starts = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
srv = socket.create_server(("0.0.0.0", 7200)); conns = {}
for _ in range(2):
    c = srv.accept()[0]; conns[c.recv(1)] = c
out = []
for i, at in enumerate(starts):
    time.sleep(max(at - time.time(), 0))
    t = threading.Thread(target=conns[b"A"].sendall, args=(bytes(pull),)) if i % 2 else None
    if t: t.start()
    left = push
    while left: left -= len(conns[b"B"].recv(min(left, 1 << 20)))
    got = time.time()
    if t: t.join()
    out.append([bool(t), 1e3 * (got - at), 1e3 * (time.time() - at)])
print(json.dumps(out), flush=True)
"""
_PULLER = """
import socket, sys
s = socket.create_connection((sys.argv[1], 7200)); s.sendall(b"A")
while s.recv(1 << 20): pass
"""
_PUSHER = """
import json, socket, sys, time
s = socket.create_connection((sys.argv[1], 7200)); s.sendall(b"B")
push, starts = int(sys.argv[2]), json.loads(sys.argv[3])
for at in starts:
    time.sleep(max(at - time.time(), 0)); s.sendall(bytes(push))
time.sleep(1)
"""


def probe(rate_bit: float, push: int, pull: int, trials: int) -> dict:
    """One rate: per trial (alone, beside a pull) the push's time in ms; the server's send's too."""
    gap = max(0.4, 4 * 8 * (push + pull) / rate_bit)
    with Cluster(3, tag="mxd") as c:
        shape(c, rate_bit, BURST_MS, BUFFER_BYTES)
        starts = json.dumps([time.time() + 2.0 + gap * i for i in range(trials)])
        srv = subprocess.Popen(["ip", "netns", "exec", c.ns(0), sys.executable, "-c", _SERVER, str(push), str(pull), starts],
                               stdout=subprocess.PIPE, text=True)
        c.procs.append(srv)
        time.sleep(0.5)
        c.procs.append(subprocess.Popen(["ip", "netns", "exec", c.ns(1), sys.executable, "-c", _PULLER, c.addr(0)]))
        time.sleep(0.2)
        c.procs.append(subprocess.Popen(["ip", "netns", "exec", c.ns(2), sys.executable, "-c", _PUSHER, c.addr(0), str(push), starts]))
        rows = json.loads(srv.communicate(timeout=60 + gap * trials)[0])
    alone = [ms for beside, ms, _ in rows if not beside]
    with_pull = [ms for beside, ms, _ in rows if beside]
    pulls = [ms for beside, _, ms in rows if beside]
    return {"rate_bit": rate_bit, "alone_ms": alone, "beside_ms": with_pull, "pull_ms": pulls,
            "payload_push_ms": 8e3 * push / (rate_bit * PAYLOAD), "payload_pull_ms": 8e3 * pull / (rate_bit * PAYLOAD)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="200e6,1e9", help="tbf rates, bit/s")
    ap.add_argument("--push-mb", type=float, default=2.0)
    ap.add_argument("--pull-mb", type=float, default=4.0)
    ap.add_argument("--trials", type=int, default=8, help="alternately alone and beside a pull")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out = []
    for rate in (float(r) for r in args.rates.split(",")):
        r = probe(rate, int(args.push_mb * 1e6), int(args.pull_mb * 1e6), args.trials)
        out.append(r)
        a, b = statistics.median(r["alone_ms"]), statistics.median(r["beside_ms"])
        print(f"{rate / 1e6:g} Mbit/s: a {args.push_mb:g} MB push into the server alone {a:.1f} ms "
              f"({min(r['alone_ms']):.1f}..{max(r['alone_ms']):.1f}), beside a {args.pull_mb:g} MB pull out of it {b:.1f} ms "
              f"({min(r['beside_ms']):.1f}..{max(r['beside_ms']):.1f}): x{b / a:.2f}; payload rate {r['payload_push_ms']:.1f} ms; "
              f"the pull took {statistics.median(r['pull_ms']):.1f} ms (payload {r['payload_pull_ms']:.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
