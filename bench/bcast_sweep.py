"""gloo broadcast (or all-to-all) against all-reduce of the same bytes, per rank count, on the namespace testbed (root).

The cost model prices a broadcast as the ring all-reduce of ``broadcast_factor(N)`` times its bytes (gloo's binomial
tree, each rank's sends at once: ``costmodel.topology.broadcast_sends``), an all-to-all (``--kind all_to_all``:
``all_to_all_single`` of an S-byte buffer per rank) as the one of ``KIND_FACTORS["all_to_all"]`` S. This measures both on N
ranks in network namespaces, each rank's egress shaped to ``--rate`` (``collect.jobs.netns.Cluster``), so the ratio per N is
measured, not assumed. Every rank enters each call from a barrier; a repetition's time is its slowest rank's; sizes
and the two kinds alternate within one job so that load drift hits both alike. Prints one JSON line per (N, size) with
the medians, their ratio, the model's ratio, the kind's time over one port's time for its bytes per rank (``wire``: S for
a broadcast, (N-1)/N S for an all-to-all) and the 1-minute load before the job.

    flock /tmp/dagprof-measure.lock python bench/bcast_sweep.py --ranks 2,3,4 --rate 200e6 --keep /tmp/zero4/sweep
    flock /tmp/dagprof-measure.lock python bench/bcast_sweep.py --kind all_to_all --ranks 2,4 --rate 1e9 --keep DIR
    flock /tmp/dagprof-measure.lock python bench/bcast_sweep.py --loopback --ranks 2,4 --rate 200e6 --keep DIR
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

SIZES = (64 << 10, 512 << 10, 2 << 20, 8 << 20)


def worker(out: str, sizes: list[int], iters: int, kind: str) -> None:
    """One rank: every size, all-reduce then ``kind`` (a broadcast from rank 0, an all-to-all), ``iters`` times each after
    one untimed call."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for _ in range(3):  # connections are made lazily
        dist.all_reduce(torch.ones(1024))
    rows = []
    for nbytes in sizes:
        buf, into = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
        other = (lambda: dist.broadcast(buf, src=0)) if kind == "broadcast" else (lambda: dist.all_to_all_single(into, buf))
        calls = {"all_reduce": lambda: dist.all_reduce(buf), kind: other}
        times: dict[str, list[float]] = {k: [] for k in calls}
        for i in range(iters + 1):
            for kind, call in calls.items():
                dist.barrier()
                t0 = time.perf_counter()
                call()
                if i:
                    times[kind].append((time.perf_counter() - t0) * 1e6)
        mine = torch.tensor([times["all_reduce"], times[kind]], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # each repetition's slowest rank
        rows.append({"nbytes": nbytes, "all_reduce_us": mine[0].tolist(), f"{kind}_us": mine[1].tolist()})
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world": world, "rows": rows}, f)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="2,3,4")
    ap.add_argument("--kind", default="broadcast", choices=("broadcast", "all_to_all"))
    ap.add_argument("--rate", type=float, default=200e6, help="bit/s on each rank's egress; 0: unshaped")
    ap.add_argument("--loopback", action="store_true",
                    help="every rank in one namespace, its loopback shaped (one shaper for every byte either way: "
                         "``shaped_loopback.shape_loopback``), as ``whatif --half-duplex`` models it")
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    ap.add_argument("--keep", default="")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    if not a.worker and not a.keep:
        ap.error("--keep is required")
    if a.worker:
        worker(a.worker, sizes, a.iters, a.kind)
        return
    import numpy as np
    from shaped_loopback import namespace, shape_loopback

    from dagprof.collect.jobs.netns import Cluster, run_ranks
    from dagprof.costmodel.alphabeta import AlphaBeta
    from dagprof.costmodel.topology import Topology, allreduce_equivalent_factor

    os.makedirs(a.keep, exist_ok=True)
    for n in (int(r) for r in a.ranks.split(",")):
        load = os.getloadavg()[0]
        out = os.path.join(a.keep, f"{a.kind}-n{n}-{a.rate:g}.json")
        argv = [sys.executable, os.path.abspath(__file__), "--worker", out, "--iters", str(a.iters), "--sizes", a.sizes, "--kind", a.kind]
        if a.loopback:
            out = out.replace(".json", "-loopback.json")
            argv[argv.index("--worker") + 1] = out
            with namespace("bs", None) as (ns, _):
                shape_loopback(ns, a.rate)
                subprocess.run(["ip", "netns", "exec", ns, "torchrun", "--standalone", "--nproc-per-node", str(n), *argv[1:]],
                               check=True, capture_output=True, timeout=600)
        else:
            with Cluster(n) as c:
                c.set_rate(a.rate or None)
                run_ranks(argv, n, os.path.join(a.keep, f"logs{n}"), {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}, c)
        half = replace(Topology.flat(n, AlphaBeta(0.0, 1.0)), half_duplex=True).one_way_share(a.kind)
        with open(out) as f:
            got = json.load(f)
        for row in got["rows"]:
            ar, bc = float(np.median(row["all_reduce_us"])), float(np.median(row[f"{a.kind}_us"]))
            wire = row["nbytes"] * (1 if a.kind == "broadcast" else (n - 1) / n) * 8e6 / a.rate if a.rate else None
            print(json.dumps({"ranks": n, "rate": a.rate, "nbytes": row["nbytes"], "all_reduce_ms": round(ar / 1e3, 2),
                              f"{a.kind}_ms": round(bc / 1e3, 2), "ratio": round(bc / ar, 3),
                              "model_ratio": round(allreduce_equivalent_factor(a.kind, "gloo", n), 3),
                              "model_ratio_half_duplex": round(half * allreduce_equivalent_factor(a.kind, "gloo", n), 3),
                              "over_wire": round(bc / wire, 3) if wire else None, "load": load}), flush=True)


if __name__ == "__main__":
    main()
