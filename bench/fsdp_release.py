"""gloo's release of the two ranks at FSDP2's calls (needs torch): per call, how long after the first rank got out of
an all-gather (or reduce-scatter) the other did, against the call's bytes and the machine's load at that moment. The
kept DDP/FSDP pairs' FSDP2 jobs released their later rank 0.0-2.6 ms (per job median) after the first, alternating
which rank (``bench/fsdp_fresh/pair_skew.py``): where that lag comes from decides whether a DDP profile can price it.

Each rank reads ``CLOCK_MONOTONIC`` (one clock for every process on the machine) as it enters and leaves every call,
so the ranks' returns compare directly: ``release`` = the later return less the first, ``first lag`` = the first
return less the later entry (the transfer and the first wake-up). Two ways to call: ``barrier`` (every repetition
from a barrier's release, as ``dagprof calibrate`` times a call) and ``chained`` (as a job: no barrier, each call after
the previous one's return plus a copy of its output, as FSDP2's copy-out, so the rank released first reaches the next
call first and waits there), and ``busy`` (chained, with ``--busy-ms`` of compute (several values: a cell each) after each call's copy-out, as a job
runs a unit's layers between its collectives: the rank released first computes on one core while the other's
threads hand the call back). Each rank's training thread's CPU and run-queue wait over the whole sweep
(``/proc/thread-self/schedstat``) give its stretch, (CPU + wait) / CPU, the measure a dagprof profile records per step
(``traces.meta.runnable_stretch``). Wall time: run it alone under the lock, or beside a job to see the load's share;
say the load.

    dp-excl torchrun --standalone --nproc-per-node 2 bench/fsdp_release.py [--iters 40 --rounds 2] [--out FILE.json]
    ... --modes barrier busy --busy-ms 0 2 5 10 20 --out FILE.json    (the release against the compute between calls)

With compute between the calls the release is two-valued, not a line in the compute: most calls release both ranks
together (as back to back), a share of them releases the later rank a scheduler slice late (2-5 ms; with 2 ms of compute,
the other rank's whole 2 ms), from 2 ms of compute on about as often at 5, 10 and 20 ms; how often follows the machine's
load (docs/evidence.md, branch fsdpbusy).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from dagprof.collect.measure.calibrate import collective_op
from dagprof.traces.comm_kind import CommKind

SIZES = (16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)  # the kept pairs' units: 58 KiB (ResNet) to 1 MiB (recommender)
KINDS = (CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER)


def schedstat() -> tuple[int, int]:
    """(CPU ns, run-queue wait ns) of the calling thread; (0, 0) without the file."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            cpu, wait, _ = f.read().split()
        return int(cpu), int(wait)
    except (OSError, ValueError):
        return 0, 0


def calls(kind: CommKind, nbytes: int, world: int, iters: int, mode: str, busy_ms: float) -> np.ndarray:
    """ns, (entry, return) x repetitions on this rank (2 warm-up calls first, untimed)."""
    make, _ = collective_op(kind, nbytes, world)
    out = np.zeros((2, iters), dtype=np.int64)
    a = torch.randn(128, 128)
    for i in range(iters + 2):
        call = make()
        if mode == "barrier":
            dist.barrier()
        t0 = time.monotonic_ns()
        call()
        t1 = time.monotonic_ns()
        if mode != "barrier":  # FSDP2's copy-out of the gathered parameters (a reduce-scatter's: its reduced shard)
            torch.empty(max(nbytes // 4, 1)).fill_(1.0)
        if mode == "busy":  # a unit's compute before the next call, as a job runs between its collectives
            end = time.monotonic_ns() + busy_ms * 1e6
            while time.monotonic_ns() < end:
                a = torch.tanh(a @ a)
        if i >= 2:
            out[:, i - 2] = (t0, t1)
    return out


def summary(both: np.ndarray) -> dict[str, float]:
    """ranks x (entry, return) x repetitions -> ms: the release, the first lag, the share rank 0 got out later."""
    entry, ret = both[:, 0, :], both[:, 1, :]
    release = (ret.max(axis=0) - ret.min(axis=0)) / 1e6
    first = (ret.min(axis=0) - entry.max(axis=0)) / 1e6
    return {"release_median_ms": round(float(np.median(release)), 3), "release_mean_ms": round(float(np.mean(release)), 3),
            "release_p90_ms": round(float(np.percentile(release, 90)), 3), "first_lag_median_ms": round(float(np.median(first)), 3),
            "rank0_later": round(float(np.mean(ret[0] > ret[1])), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", nargs="+", choices=("barrier", "chained", "busy"), default=["barrier", "chained", "busy"])
    ap.add_argument("--busy-ms", type=float, nargs="+", default=[3.0], help="busy: compute between calls, ms (each value a cell)")
    ap.add_argument("--kinds", nargs="+", choices=[k.label for k in KINDS], default=[k.label for k in KINDS])
    ap.add_argument("--out", help="also write the result here (rank 0)")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    for _ in range(3):
        dist.all_reduce(torch.ones(1024))
    load0, s0 = os.getloadavg(), schedstat()
    per: dict[tuple[str, float, str, int], list[np.ndarray]] = {}
    cells = [(m, b) for m in args.modes for b in (args.busy_ms if m == "busy" else [0.0])]
    kinds = [k for k in KINDS if k.label in args.kinds]
    for _ in range(args.rounds):  # every cell in each round: the machine's load reaches all alike
        for mode, busy in cells:
            for kind in kinds:
                for size in SIZES:
                    mine = torch.from_numpy(calls(kind, size, world, args.iters, mode, busy))
                    every = [torch.empty_like(mine) for _ in range(world)]
                    dist.all_gather(every, mine)
                    per.setdefault((mode, busy, kind.label, size), []).append(torch.stack(every).numpy())
    s1 = schedstat()
    cpu, wait = s1[0] - s0[0], s1[1] - s0[1]
    stretch = torch.tensor([(cpu + wait) / cpu if cpu > 0 else 0.0], dtype=torch.float64)
    stretches = [torch.empty_like(stretch) for _ in range(world)]
    dist.all_gather(stretches, stretch)
    if dist.get_rank() == 0:
        cells = [{"mode": m, "busy_ms": b, "kind": k, "bytes": s, **summary(np.concatenate(v, axis=2))} for (m, b, k, s), v in per.items()]
        out = {"torch": torch.__version__, "world": world, "load_before": load0, "load_after": os.getloadavg(),
               "stretch": [round(float(x), 3) for x in stretches], "cells": cells}
        print(json.dumps(out))
        if args.out:  # with each call's release, ms
            for c, v in zip(cells, per.values()):
                ret = np.concatenate(v, axis=2)[:, 1, :]
                c["release_ms"] = [round(float(x), 4) for x in (ret.max(axis=0) - ret.min(axis=0)) / 1e6]
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
