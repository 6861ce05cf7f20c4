"""MXNet parameter server on the namespace testbed: what-if (servers, bandwidth) vs measured (run as root).

A real ``dist_sync`` job (scheduler, servers, 2 workers; ``collect/mxnet_ps.py``) runs with every
process in its own network namespace behind a bridge; each port is shaped with ``tc tbf`` in both
directions (the rank's egress, and the bridge's egress towards the rank: a switch port's downlink),
so a server receiving N pushes takes N times as long, as on a real switch. One configuration is
profiled (1 server, the profiled rate); from that profile dagprof predicts 2 servers and another
rate, and each configuration is measured. Rounds interleave the configurations (the machine is
shared and drifts); each round predicts from its own profile; the table gives medians and spread.

    sudo .venv/bin/python bench/bench_mxnet_ps.py --python /work/venvs/mxnet/bin/python [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "testbed"))

from netns import Cluster, available  # noqa: E402

from dagprof.collect.mxnet_ps import launch  # noqa: E402

WORKERS = 2


def shape(c: Cluster, rate_bit: float) -> None:
    """tbf on every rank's egress (Cluster.set_rate) and on the bridge's port towards it."""
    c.set_rate(rate_bit)
    burst = max(int(rate_bit / 8 / 1000), 8 * 1514)
    for r in range(c.ranks):
        base = ["ip", "netns", "exec", f"{c.tag}sw", "tc", "qdisc"]
        subprocess.run(base + ["del", "dev", f"{c.tag}p{r}", "root"], capture_output=True)
        subprocess.run(base + ["add", "dev", f"{c.tag}p{r}", "root", "tbf", "rate", f"{int(rate_bit)}bit", "burst", str(burst), "latency", "10ms"],
                       check=True, capture_output=True)


def run_job(python: str, out: str, servers: int, rate_bit: float, profile_steps: int, steps: int, port: int) -> list[float]:
    """One job in namespaces; per-step times (max over workers) of its timed steps, in ms."""
    with Cluster(servers + WORKERS, tag="mx") as c:
        shape(c, rate_bit)

        def spawn(node: int, argv: list, env: dict, log: str, cwd: str | None = None) -> subprocess.Popen:
            with open(log, "w") as f:
                p = subprocess.Popen(["ip", "netns", "exec", c.ns(node)] + argv, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                                     cwd=cwd)
            c.procs.append(p)
            return p

        m = launch(out, python, servers=servers, workers=WORKERS, warmup=2, profile_steps=profile_steps, steps=steps, port=port,
                   addr=c.addr, ifname=c.ifname, spawn=spawn, timeout_s=240, extra={"testbed": {"rate_bit": rate_bit, "shaped": "both directions"}})
    per_worker = [m["timed_s"][str(w)] for w in range(WORKERS)]
    return [1e3 * max(ts) for ts in zip(*per_worker)]


def predict(run_dir: str, rate0: float, cells: list[tuple[int, float]]) -> tuple[dict, float]:
    """Each (servers, rate) from the one profile: ``ps:K`` re-places the keys as ps-lite does; another rate
    scales the fitted bandwidth by the rate ratio (framing overhead carries over)."""
    from dagprof.analysis import job_iteration_us
    from dagprof.costmodel.topology import CollectiveSpec
    from dagprof.passes import set_link, set_scheme
    from dagprof.passes.comm import current_topology
    from dagprof.pipeline import open_run

    p = open_run(run_dir)
    bw0 = current_topology(p.graph).inter.bandwidth_bytes_per_s
    out = {}
    for servers, rate in cells:
        g = set_scheme(p.graph, CollectiveSpec.parse(f"ps:{servers}"))
        if rate != rate0:
            g = set_link(g, bw0 * rate / rate0)
        out[(servers, rate)] = job_iteration_us(g) / 1e3
    return out, p.analysis.predicted_us / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="/work/venvs/mxnet/bin/python", help="a Python that imports mxnet 1.x")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per job")
    ap.add_argument("--rate", type=float, default=500e6, help="profiled link rate, bit/s")
    ap.add_argument("--other-rate", type=float, default=200e6, help="the rate to predict, bit/s")
    ap.add_argument("--keep", default=None, help="keep the run folders here")
    args = ap.parse_args()
    why = available()
    if why:
        print(f"bench_mxnet_ps: skipped: {why}", file=sys.stderr)
        return 0
    if not os.path.exists(args.python):
        print(f"bench_mxnet_ps: skipped: no MXNet Python at {args.python}", file=sys.stderr)
        return 0
    cells = [(1, args.rate), (2, args.rate), (1, args.other_rate)]
    measured: dict = {c: [] for c in cells}
    predicted: dict = {c: [] for c in cells}
    replayed = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dagprof-mxps-") as tmp:
        work = args.keep or tmp
        for k in range(args.rounds):
            order = cells if k % 2 == 0 else cells[::-1]
            for servers, rate in order:
                prof = (servers, rate) == cells[0]
                out = os.path.join(work, f"round{k}", f"s{servers}_{int(rate / 1e6)}M")
                steps = run_job(args.python, out, servers, rate, 3 if prof else 0, args.steps, 9300 + k * 10 + servers)
                measured[(servers, rate)] += steps
                if prof:
                    pred, rep = predict(out, rate, cells)
                    for c in cells:
                        predicted[c].append(pred[c])
                    replayed.append(rep)
                print(f"round {k + 1}: {servers} server(s) {rate / 1e6:g} Mbit/s: {statistics.median(steps):.1f} ms/step", file=sys.stderr)
    print(f"MXNet 1.9 dist_sync, {WORKERS} workers, profiled: 1 server at {args.rate / 1e6:g} Mbit/s; {args.rounds} interleaved rounds "
          f"(shared 2-core machine); measured = median of all timed steps, predicted = median over rounds (each from its round's profile)")
    print(f"{'servers':>7} {'link':>10} {'measured ms':>12} {'(min..max)':>16} {'predicted ms':>13} {'(min..max)':>16} {'error %':>8}")
    errs = []
    for c in cells:
        m, p = statistics.median(measured[c]), statistics.median(predicted[c])
        err = 100 * (p - m) / m
        if c != cells[0]:
            errs.append(abs(err))
        tag = "  (profiled)" if c == cells[0] else ""
        print(f"{c[0]:>7} {c[1] / 1e6:>6g}Mbit {m:>12.1f} {min(measured[c]):>7.1f}..{max(measured[c]):<7.1f} {p:>13.1f} "
              f"{min(predicted[c]):>7.1f}..{max(predicted[c]):<7.1f} {err:>+8.1f}{tag}")
    print(f"what-if |error| (not profiled): max {max(errs):.1f} %, goal 8 %")
    print(f"replay of the profiled graph: {statistics.median(replayed):.1f} ms/step (link fitted to it)")
    print(f"wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
