"""How a shaped port's head start changes with its rate, on the testbed as hosts (``fresh_rounds.py``'s link).

Two gloo ranks (torch), each in its own namespace behind a ``tc tbf`` port (``collect.jobs.netns.Cluster.set_rate``:
a bucket of 1 ms at the rate), run FSDP's pattern on CPU: a spell of compute (``--gaps-ms``, a busy loop on both ranks,
no barrier) then one collective, back to back, as the units of an HSDP step do: an all-gather of ``S`` bytes a rank (one
gloo phase) or an all-reduce of ``2 S`` (gloo's reduce-scatter on CPU: two phases of ``S`` a port). Each instance is
timed on both ranks (``time.perf_counter``, one clock for the machine); printed per rate, kind, size and gap: the median
of last join -> first rank out and -> last rank out, against the wire's time for the bytes a port sends (``S`` a phase at
the payload share of a 1500 B frame, ``shaped_loopback.PAYLOAD_SHARE``), and the head start (wire - first out).

A bucket passes its bytes at once after an idle spell and refills at the rate, so on its own it saves the same time
(up to 1 ms) at every rate; a port still sending the previous collective's tail when the next one starts (its sender
left with the bytes in its socket) has no full bucket. This prints which holds for each gap.

    sudo python bench/tbf_gap_headstart.py [--rates 1e9,200e6] [--sizes-kb 25,100,400] [--gaps-ms 0.3,1.5,4] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

KINDS = ("all_gather", "all_reduce")  # phases a port sends: 1, 2
PHASES = {"all_gather": 1, "all_reduce": 2}


def busy(ms: float) -> None:
    until = time.perf_counter() + ms / 1e3
    while time.perf_counter() < until:
        pass


def worker(sizes: list[int], gaps: list[float], reps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rows = []
    for kind in KINDS:
        for nbytes in sizes:
            shard = torch.ones(nbytes // 4)
            gathered = torch.empty(2 * nbytes // 4)
            whole = torch.ones(2 * nbytes // 4)
            op = (lambda: dist.all_gather_into_tensor(gathered, shard)) if kind == "all_gather" else (lambda: dist.all_reduce(whole))
            for gap in gaps:
                dist.barrier()
                for i in range(reps + 2):  # 2 warm-up
                    busy(gap)
                    t0 = time.perf_counter()
                    op()
                    t1 = time.perf_counter()
                    if i >= 2:
                        rows.append({"kind": kind, "bytes": nbytes, "gap_ms": gap, "i": i, "t0": t0, "t1": t1})
                busy(5.0)  # the port drains before the next setting's barrier
    with open(f"{out}.{rank}", "w") as f:
        json.dump(rows, f)
    dist.destroy_process_group()


def summarise(a: list[dict], b: list[dict], rate: float, payload_share: float) -> list[dict]:
    per = {}
    for x, y in zip(a, b):
        assert (x["kind"], x["bytes"], x["gap_ms"], x["i"]) == (y["kind"], y["bytes"], y["gap_ms"], y["i"])
        join = max(x["t0"], y["t0"])
        first, last = sorted([x["t1"], y["t1"]])
        per.setdefault((x["kind"], x["bytes"], x["gap_ms"]), []).append(((first - join) * 1e3, (last - join) * 1e3,
                                                                           abs(x["t0"] - y["t0"]) * 1e3))
    rows = []
    for (kind, nbytes, gap), xs in per.items():
        wire = PHASES[kind] * nbytes * 8 / (rate * payload_share) * 1e3
        first = statistics.median(v[0] for v in xs)
        rows.append({"rate_bit": rate, "kind": kind, "bytes": nbytes, "gap_ms": gap, "first_out_ms": first,
                     "last_out_ms": statistics.median(v[1] for v in xs), "join_lag_ms": statistics.median(v[2] for v in xs),
                     "wire_ms": wire, "head_ms": wire - first, "n": len(xs)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1e9,200e6")
    ap.add_argument("--sizes-kb", default="25,100,400")
    ap.add_argument("--gaps-ms", default="0.3,1.5,4")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(float(s) * 1000) // 8 * 8 for s in args.sizes_kb.split(",")]
    gaps = [float(g) for g in args.gaps_ms.split(",")]
    if args.worker:
        worker(sizes, gaps, args.reps, args.worker)
        return
    from shaped_loopback import PAYLOAD_SHARE

    from dagprof.collect.jobs.netns import Cluster, free_port

    results = []
    with Cluster(2) as c, tempfile.TemporaryDirectory(prefix="dagprof-tgh-") as tmp:
        for rate in [float(r) for r in args.rates.split(",")]:
            c.set_rate(rate)
            out, port = os.path.join(tmp, f"r{rate:g}"), free_port()
            argv = [sys.executable, os.path.abspath(__file__), "--sizes-kb", args.sizes_kb, "--gaps-ms", args.gaps_ms, "--reps", str(args.reps),
                    "--worker", out]
            procs = [c.spawn(r, argv, {"RANK": str(r), "WORLD_SIZE": "2", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"},
                             os.path.join(tmp, f"log{r}")) for r in range(2)]
            if any(p.wait(timeout=300) for p in procs):
                sys.exit("a worker failed: " + open(os.path.join(tmp, "log0")).read()[-2000:])
            results += summarise(json.load(open(f"{out}.0")), json.load(open(f"{out}.1")), rate, PAYLOAD_SHARE)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{'rate':>5} {'kind':10} {'kB':>5} {'gap':>4} {'lag':>5} {'first':>7} {'last':>7} {'wire':>7} {'head':>6}")
    for r in results:
        print(f"{r['rate_bit'] / 1e6:5.0f} {r['kind']:10} {r['bytes'] / 1e3:5.0f} {r['gap_ms']:4.1f} {r['join_lag_ms']:5.2f} "
              f"{r['first_out_ms']:7.2f} {r['last_out_ms']:7.2f} {r['wire_ms']:7.2f} {r['head_ms']:+6.2f}")


if __name__ == "__main__":
    main()
