"""gloo collectives of other kinds against all-reduce of the same bytes, per rank count, on the namespace testbed (root).

The cost model prices a broadcast as the ring all-reduce of ``broadcast_factor(N)`` times its bytes (gloo's binomial
tree, each rank's sends at once: ``costmodel.topology.broadcast_sends``), an all-to-all (``--kind all_to_all``:
``all_to_all_single`` of an S-byte buffer per rank) as the one of ``all_to_all_factor(N)`` S, and a gather, scatter or
all-gather of S bytes per rank (``--kind gather,scatter,all_gather``; a reduce-scatter's S is its output chunk) by
``costmodel.topology.per_rank_equivalent_bytes``. This measures them on N ranks in network namespaces, each rank's egress
shaped to ``--rate`` (``collect.jobs.netns.Cluster``), or on one shaped loopback (``--loopback``), so the ratio per N is
measured, not assumed. Every rank enters each call from a barrier; a repetition's time is its slowest rank's; sizes
and the kinds alternate within one job so that load drift hits them alike. Prints one JSON line per (N, kind, size) with
the medians, their ratio, the model's ratio, the kind's time over one port's time for its bytes per rank (``wire``: S for
a broadcast, (N-1)/N S for an all-to-all, (N-1) S for the rest) and the 1-minute load before the job. ``--trace DIR``
then records ``--trace-steps`` more rounds of every size under ``torch.profiler`` (``record_shapes``, as a user traces),
one Kineto trace per rank in ``DIR/n<ranks>``: ``tests/data/gloo-kinds`` is such a recording.

    flock /tmp/dagprof-measure.lock python bench/bcast_sweep.py --ranks 2,3,4 --rate 200e6 --keep /tmp/zero4/sweep
    flock /tmp/dagprof-measure.lock python bench/bcast_sweep.py --kind all_to_all --ranks 2,4 --rate 1e9 --keep DIR
    flock /tmp/dagprof-measure.lock python bench/bcast_sweep.py --loopback --ranks 2,4 --rate 200e6 --keep DIR
    flock /tmp/dagprof-measure.lock python bench/bcast_sweep.py --loopback --kind gather,scatter,all_gather,all_to_all \
        --ranks 4 --rate 200e6 --sizes 262144,1048576 --keep DIR --trace DIR/trace4
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


KINDS = ("broadcast", "all_to_all", "gather", "scatter", "all_gather", "reduce_scatter")


def calls_of(kinds: list[str], nbytes: int) -> dict:
    """Per kind, a call of ``nbytes`` per rank (an all-to-all's and a broadcast's: the whole buffer), and the all-reduce of
    as many bytes first."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    buf, into, chunks = torch.ones(nbytes // 4), torch.empty(nbytes // 4), [torch.ones(nbytes // 4) for _ in range(world)]
    whole = torch.ones(world * (nbytes // 4))
    make = {"broadcast": lambda: dist.broadcast(buf, src=0), "all_to_all": lambda: dist.all_to_all_single(into, buf),
            "gather": lambda: dist.gather(buf, chunks if rank == 0 else None, dst=0),
            "scatter": lambda: dist.scatter(into, chunks if rank == 0 else None, src=0),
            "all_gather": lambda: dist.all_gather(chunks, buf),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(into, whole)}
    return {"all_reduce": lambda: dist.all_reduce(buf), **{k: make[k] for k in kinds}}


def worker(out: str, sizes: list[int], iters: int, kinds: list[str], trace: str, trace_steps: int) -> None:
    """One rank: every size, all-reduce then each of ``kinds``, ``iters`` times each after one untimed call; then, with
    ``trace``, ``trace_steps`` profiled rounds of every size (a step each)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for _ in range(3):  # connections are made lazily
        dist.all_reduce(torch.ones(1024))
    rows = []
    for nbytes in sizes:
        calls = calls_of(kinds, nbytes)
        times: dict[str, list[float]] = {k: [] for k in calls}
        for i in range(iters + 1):
            for kind, call in calls.items():
                dist.barrier()
                t0 = time.perf_counter()
                call()
                if i:
                    times[kind].append((time.perf_counter() - t0) * 1e6)
        mine = torch.tensor([times[k] for k in calls], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # each repetition's slowest rank
        rows.append({"nbytes": nbytes, **{f"{k}_us": mine[j].tolist() for j, k in enumerate(calls)}})
    if trace:
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        rounds = [calls_of(kinds, nbytes) for nbytes in sizes]
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=0, warmup=1, active=trace_steps),
                     on_trace_ready=tensorboard_trace_handler(trace, worker_name=f"rank{rank}", use_gzip=True)) as prof:
            for _ in range(trace_steps + 1):
                for calls in rounds:
                    for call in calls.values():
                        dist.barrier()
                        call()
                prof.step()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world": world, "rows": rows}, f)
    dist.destroy_process_group()


def model_ratio(kind: str, world: int, half_duplex: bool) -> float:
    """The cost model's price of a ``kind`` call of S bytes per rank over the all-reduce's of S, in all-reduce-equivalent
    bytes (an all-gather's bytes are the gathered N S, ``CommKind.event_bytes``; gloo's reduce-scatter all-reduces its whole
    input: N S). Its latency (``costmodel.topology.latency_steps``) is not in the ratio."""
    from dagprof.costmodel.alphabeta import AlphaBeta
    from dagprof.costmodel.topology import Topology, per_rank_equivalent_bytes
    from dagprof.traces.events import CommKind

    k = CommKind.from_label(kind)
    share = replace(Topology.flat(world, AlphaBeta(0.0, 1.0)), half_duplex=half_duplex).one_way_share(k)
    return share * (world if k == CommKind.REDUCE_SCATTER else per_rank_equivalent_bytes(k, k.event_bytes(1, world), world))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="2,3,4")
    ap.add_argument("--kind", default="broadcast", help=f"comma-separated, of {', '.join(KINDS)}")
    ap.add_argument("--rate", type=float, default=200e6, help="bit/s on each rank's egress; 0: unshaped")
    ap.add_argument("--loopback", action="store_true",
                    help="every rank in one namespace, its loopback shaped (one shaper for every byte either way: "
                         "``shaped_loopback.shape_loopback``), as ``whatif --half-duplex`` models it")
    ap.add_argument("--both-ways", action="store_true",
                    help="shape each rank's ingress too (the switch's side of its port), as a switched port's two directions: "
                         "else a rank receives from every peer at once at their summed rates")
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    ap.add_argument("--keep", default="")
    ap.add_argument("--trace", default="", help="record Kineto traces of every rank after the sweep, in DIR/n<ranks>")
    ap.add_argument("--trace-steps", type=int, default=2)
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes, kinds = [int(s) for s in a.sizes.split(",")], a.kind.split(",")
    if not set(kinds) <= set(KINDS):
        ap.error(f"--kind takes {', '.join(KINDS)}, got {a.kind!r}")
    if not a.worker and not a.keep:
        ap.error("--keep is required")
    if a.worker:
        worker(a.worker, sizes, a.iters, kinds, a.trace, a.trace_steps)
        return
    import numpy as np
    from shaped_loopback import namespace, shape_loopback

    from dagprof.collect.jobs.netns import Cluster, run_ranks

    os.makedirs(a.keep, exist_ok=True)
    tag = a.kind.replace(",", "+")
    for n in (int(r) for r in a.ranks.split(",")):
        load = os.getloadavg()[0]
        out = os.path.join(a.keep, f"{tag}-n{n}-{a.rate:g}{'-loopback' if a.loopback else '-both' if a.both_ways else ''}.json")
        argv = [sys.executable, os.path.abspath(__file__), "--worker", out, "--iters", str(a.iters), "--sizes", a.sizes, "--kind", a.kind,
                *(["--trace", os.path.join(os.path.abspath(a.trace), f"n{n}"), "--trace-steps", str(a.trace_steps)] if a.trace else [])]
        if a.loopback:
            with namespace("bs", None) as (ns, _):
                shape_loopback(ns, a.rate)
                subprocess.run(["ip", "netns", "exec", ns, "torchrun", "--standalone", "--nproc-per-node", str(n), *argv[1:]],
                               check=True, capture_output=True, timeout=600)
        else:
            with Cluster(n) as c:
                c.set_rate(a.rate or None)
                for r in range(n) if a.both_ways and a.rate else ():
                    subprocess.run(["ip", "netns", "exec", f"{c.tag}sw", "tc", "qdisc", "replace", "dev", f"{c.tag}p{r}", "root", "tbf",
                                    "rate", f"{int(a.rate)}bit", "burst", str(max(int(a.rate / 8 / 1000), 8 * 1514)), "limit",
                                    str(c.buffer_bytes)], check=True, capture_output=True)
                run_ranks(argv, n, os.path.join(a.keep, f"logs{n}"), {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}, c)
        with open(out) as f:
            got = json.load(f)
        for row in got["rows"]:
            ar = float(np.median(row["all_reduce_us"]))
            for kind in kinds:
                bc = float(np.median(row[f"{kind}_us"]))
                per_port = {"broadcast": 1.0, "all_to_all": (n - 1) / n}.get(kind, n - 1)
                wire = row["nbytes"] * per_port * 8e6 / a.rate if a.rate else None
                print(json.dumps({"ranks": n, "rate": a.rate, "loopback": a.loopback, "both_ways": a.both_ways, "kind": kind, "nbytes": row["nbytes"],
                                  "all_reduce_ms": round(ar / 1e3, 2), "kind_ms": round(bc / 1e3, 2), "ratio": round(bc / ar, 3),
                                  "model_ratio": round(model_ratio(kind, n, False), 3),
                                  "model_ratio_half_duplex": round(model_ratio(kind, n, True), 3),
                                  "over_wire": round(bc / wire, 3) if wire else None, "load": load}), flush=True)


if __name__ == "__main__":
    main()
