"""Do delayed ACKs slow gloo's 2-rank rings in 6-rank HSDP jobs? (root, the namespace testbed)

HSDP jobs (``bench/fsdp_train.py``, ``--layouts``, default 3x2 and 2x3: three 2-rank rings at a time, shard pairs and
replica pairs) are profiled at one link rate, each with and without ``quickack 1`` on every rank's route (no delayed
ACK: the kernel ACKs each segment at once), in interleaved order. Per job: each rank namespace's TCP counters over the
job (``nstat``: DelayedACKs, TCPAckCompressed, ...), rank 0's mean step, and per ring size and kind the first rank out
after the last rank's transfer start, measured over what ``costmodel.gloo_ring`` replays from those starts (the ratio
``tests/test_gloo_ring.py`` checks), median over the profile's collectives.

    sudo .venv/bin/python bench/bench_ring_acks.py [--rate 200Mbit] [--steps 20] [--rounds 2] [--layouts 3x2,2x3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fsdp import RATES, TESTBED_MODEL, job  # noqa: E402
from bench_hsdp_mesh import mesh_flags, world_of  # noqa: E402

COUNTERS = ("TcpExtDelayedACKs", "TcpExtDelayedACKLocked", "TcpExtDelayedACKLost", "TcpExtTCPAckCompressed", "TcpOutSegs",
            "TcpInSegs", "TcpRetransSegs", "TcpExtTCPPureAcks", "TcpExtTCPHPAcks")
WIRE = 1514 / 1448  # wire bytes per TCP payload byte (``tests/test_gloo_ring.py``)


def counters(ns: str) -> dict[str, int]:
    """The namespace's absolute TCP counters (``nstat -asz``: nothing reset, no history written)."""
    out = subprocess.run(["ip", "netns", "exec", ns, "nstat", "-asz", "--json"], capture_output=True, text=True, check=True).stdout
    flat: dict[str, int] = {}
    for v in json.loads(out).values():
        flat.update(v)
    return flat


def set_quickack(cluster, on: bool) -> None:
    """``quickack 1`` (or 0) on each rank's route to the subnet."""
    from dagprof.collect.jobs.netns import SUBNET

    for r in range(cluster.ranks):
        subprocess.run(["ip", "-n", cluster.ns(r), "route", "change", f"{SUBNET}.0/24", "dev", cluster.ifname(r), "proto", "kernel",
                        "scope", "link", "src", cluster.addr(r), "quickack", "1" if on else "0"], check=True, capture_output=True)


def ring_ratios(run: str, rate_bit: float) -> dict[tuple[str, int], float]:
    """(kind, ring size) -> median over the profile's collectives of the first rank out after the last transfer start,
    measured over replayed (``costmodel.gloo_ring.ring_done`` from the measured starts at the port's rate)."""
    import dagprof.graph.shared_collectives as shared
    from dagprof.costmodel.gloo_ring import ring_done
    from dagprof.graph.build import build_graph
    from dagprof.traces.dagprof_run import read_run

    seen, view = [], shared._view

    def observed(asm, ends, ref_ns):
        v = view(asm, ends, ref_ns)
        seen.append((ends[0].name.split(" ", 1)[0], int(ends[0].nbytes), v.join, v.done))
        return v
    shared._view = observed
    try:
        build_graph(read_run(run))
    finally:
        shared._view = view
    per_byte = 8 / rate_bit * 1e6 * WIRE
    out: dict[tuple[str, int], list[float]] = {}
    for kind, nbytes, join, done in seen:
        sim = ring_done(kind == "all_gather", join, nbytes, per_byte)
        out.setdefault((kind, len(join)), []).append((done.min() - join.max()) / (sim.min() - join.max()))
    return {k: statistics.median(v) for k, v in sorted(out.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="200Mbit", choices=list(RATES))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--layouts", default="3x2,2x3")
    ap.add_argument("--keep", metavar="DIR", help="keep the profiles and acks.json in DIR")
    args = ap.parse_args()
    from dagprof.collect.jobs.netns import Cluster, available

    why = available()
    if why:
        print(f"skipped: {why}")
        return
    layouts = args.layouts.split(",")
    world = world_of(layouts)
    rows = []
    with Cluster(world) as cluster, tempfile.TemporaryDirectory(prefix="dagprof-acks-") as tmp:
        out_dir = args.keep or tmp
        os.makedirs(out_dir, exist_ok=True)
        cluster.set_rate(RATES[args.rate])
        for k in range(args.rounds):
            for quick in (False, True)[::1 if k % 2 == 0 else -1]:
                set_quickack(cluster, quick)
                for layout in layouts[::1 if k % 2 == 0 else -1]:
                    run = os.path.join(out_dir, f"run{k}-{layout}-{'quick' if quick else 'delayed'}")
                    before = [counters(cluster.ns(r)) for r in range(world)]
                    ms = job(world, TESTBED_MODEL + mesh_flags(layout), args.steps, run + "-log", cluster, profile=run, kineto=False,
                             stat=statistics.fmean)
                    after = [counters(cluster.ns(r)) for r in range(world)]
                    delta = {c: sum(a.get(c, 0) - b.get(c, 0) for a, b in zip(after, before)) for c in COUNTERS}
                    ratios = ring_ratios(run, RATES[args.rate])
                    rows.append({"round": k + 1, "layout": layout, "quickack": quick, "step_ms": ms, "load": os.getloadavg()[0],
                                 "counters": delta, "ratios": {f"{kind} {n}": x for (kind, n), x in ratios.items()}})
                    print(f"  round {k + 1} {layout} quickack {int(quick)}: step {ms:.1f} ms (profiled); measured/replayed first out: "
                          + ", ".join(f"{kind} x{n} {x:.3f}" for (kind, n), x in ratios.items())
                          + "; counters (all ranks): " + ", ".join(f"{c.removeprefix('TcpExt')} {v}" for c, v in delta.items())
                          + f"; load {os.getloadavg()[0]:.2f}", flush=True)
                    if args.keep:
                        with open(os.path.join(args.keep, "acks.json"), "w") as f:
                            json.dump({"rate": args.rate, "steps": args.steps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
