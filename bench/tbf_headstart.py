"""Why a shaped testbed link fits faster than its rate: tbf's bucket, or bytes crossing before the collective's timed start.

As root, on the testbed's shaped loopback (``shaped_loopback.shape_loopback``, the JAX rounds' 25 kB bucket: 1 ms at
200 Mbit/s), two gloo ranks (torch) time all-reduces and reduce-scatters of 16 kB-8 MB at each rate, both ranks joined
(after a barrier) and with one rank ``--head-ms`` late, as a JAX round's ranks came to its 1 MB reduce-scatters. The time
is the late rank's, from its call to its return: what dagprof's node measures, from the last rank's join. Each is printed
against the wire's time for the bytes on the one shaped device (both ranks' sends; payload at ``PAYLOAD_SHARE``), with the
qdisc's rate and burst as tc reads them back. ``--bucket-bytes`` a smaller bucket as a control (default: the testbed's).

    sudo python bench/tbf_headstart.py [--rates 1e9,200e6] [--sizes-kb 16,64,256,1024,4096,8192] [--head-ms 3] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

KINDS = ("all_reduce", "reduce_scatter")


def medium_bytes(kind: str, nbytes: int, world: int = 2) -> float:
    """Bytes both ranks put on the one shaped device: a ring all-reduce 2 (N - 1) / N of the array per rank, a
    reduce-scatter (N - 1) / N."""
    per_rank = (2 if kind == "all_reduce" else 1) * (world - 1) / world * nbytes
    return world * per_rank


def worker(rank: int, port: int, sizes: list[int], heads: list[float], reps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rows = []
    for kind in KINDS:
        for nbytes in sizes:
            x = torch.ones(nbytes // 4)
            half = torch.empty(nbytes // 8)
            op = (lambda: dist.all_reduce(x)) if kind == "all_reduce" else (lambda: dist.reduce_scatter_tensor(half, x))
            for head in heads:
                for i in range(reps + 2):  # 2 warm-up
                    dist.barrier()
                    if rank == 1 and head > 0:  # the late rank: busy, as a rank still computing
                        until = time.perf_counter() + head / 1e3
                        while time.perf_counter() < until:
                            pass
                    t0 = time.perf_counter()
                    op()
                    t1 = time.perf_counter()
                    if i >= 2:
                        rows.append({"kind": kind, "bytes": nbytes, "head_ms": head, "us": (t1 - t0) * 1e6})
    with open(f"{out}.{rank}", "w") as f:
        json.dump(rows, f)
    dist.destroy_process_group()


def qdisc_options(ns: str) -> dict:
    r = subprocess.run(["ip", "netns", "exec", ns, "tc", "-j", "qdisc", "show", "dev", "lo"], capture_output=True, text=True, check=True)
    root = [q for q in json.loads(r.stdout or "[]") if q.get("root")]
    return root[0].get("options", {}) if root else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1e9,200e6")
    ap.add_argument("--sizes-kb", default="16,64,256,1024,4096,8192")
    ap.add_argument("--head-ms", type=float, default=3.0)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--bucket-bytes", type=int, default=0, help="tbf burst; 0: the testbed's (shape_loopback, 1 ms at 200 Mbit/s)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=2, metavar=("RANK", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=29651, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(float(s) * 1024) for s in args.sizes_kb.split(",")]
    heads = [0.0, args.head_ms]
    if args.worker:
        worker(int(args.worker[0]), args.port, sizes, heads, args.reps, args.worker[1])
        return
    import statistics
    import tempfile

    from shaped_loopback import PAYLOAD_SHARE, namespace, shape_loopback

    results = []
    with namespace("tbh", None) as (ns, tmp):
        for rate in [float(r) for r in args.rates.split(",")]:
            shape_loopback(ns, rate, 200e6)
            if args.bucket_bytes:
                subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", f"{int(rate)}bit",
                                "burst", str(args.bucket_bytes), "limit", str(2 << 20)], check=True, capture_output=True)
            opts = qdisc_options(ns)
            out = tempfile.mktemp(dir=tmp)
            argv = [sys.executable, os.path.abspath(__file__), "--rates", args.rates, "--sizes-kb", args.sizes_kb, "--head-ms", str(args.head_ms),
                    "--reps", str(args.reps), "--port", str(args.port)]
            procs = [subprocess.Popen(["ip", "netns", "exec", ns, *argv, "--worker", str(r), out]) for r in range(2)]
            if any(p.wait(timeout=600) for p in procs):
                sys.exit("a worker failed")
            late = json.load(open(f"{out}.1"))
            per_byte = 8 / (rate * PAYLOAD_SHARE)  # s per payload byte on the shaped device
            for kind in KINDS:
                for nbytes in sizes:
                    for head in heads:
                        us = [r["us"] for r in late if r["kind"] == kind and r["bytes"] == nbytes and r["head_ms"] == head]
                        wire = medium_bytes(kind, nbytes) * per_byte * 1e6
                        results.append({"rate_bit": rate, "burst_bytes": opts.get("burst"), "kind": kind, "bytes": nbytes, "head_ms": head,
                                        "median_us": statistics.median(us), "min_us": min(us), "wire_us": wire,
                                        "of_wire": statistics.median(us) / wire})
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{'rate':>6} {'burst':>6} {'kind':14} {'bytes':>8} {'late ms':>7} {'median us':>10} {'min us':>9} {'wire us':>9} {'of wire':>7}")
    for r in results:
        print(f"{r['rate_bit'] / 1e6:6.0f} {r['burst_bytes']!s:>6} {r['kind']:14} {r['bytes']:8d} {r['head_ms']:7.1f} {r['median_us']:10.0f} "
              f"{r['min_us']:9.0f} {r['wire_us']:9.0f} {r['of_wire']:7.2f}")


if __name__ == "__main__":
    main()
