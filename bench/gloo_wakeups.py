"""Why a PyTorch job's gloo threads take more CPU a step on a slower link: their wake-ups follow the wire's time, not the
bytes. No lock: it reads kept profiles (dagprof runs that recorded their threads, ``traces.meta.OtherThreads``).

Per profile and rank, over its profiled steps (medians): the process's threads other than the training thread (gloo's)
their CPU, the times they got a core (wake-ups) and their waits for one; the CPU and the wait a wake-up; and the wake-ups
per ms of the wire's time for the bytes the rank sends a step (a ring's 2 (n-1)/n of each collective's all-reduce
equivalent, ``passes.comm_cpu``, at ``shaped_loopback.PAYLOAD_SHARE`` of each frame) at the profile's rate. The HSDP
transformer's 1 Gbit/s and 200 Mbit/s profiles (hsdp68's kept rounds, 2026-12-07): 10.8-11.4 wake-ups per ms of wire at
both rates, so 5x the wake-ups at 200 Mbit/s, each with about half the CPU (fewer bytes arrived per wake-up).

    .venv/bin/python bench/gloo_wakeups.py RUN:RATE [RUN:RATE ...]     # RATE as --bandwidth takes it: 1Gbit, 200Mbit
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shaped_loopback import PAYLOAD_SHARE  # noqa: E402


def wakeups(run: str, rate: float) -> dict[int, dict[str, float]]:
    """Per profiled rank: other threads' CPU, runs and wait a step (ms, medians), CPU and wait a run (us, over the steps),
    the wire's ms a step at ``rate`` (bytes/s) and the runs per ms of it."""
    import numpy as np

    from dagprof.passes.comm_cpu import _sent
    from dagprof.pipeline import open_run

    g = open_run(run).graph
    loop = g.meta.loop_steps
    if loop is None or not loop.sched:
        raise SystemExit(f"gloo_wakeups: {run}: no threads recorded (a dagprof run of 2026-12-06 or later)")
    sent = _sent(g)
    steps = max(len(np.unique(g.step[sent.wait])), 1)
    out = {}
    for r, prof in sorted(loop.profiled.items()):
        got = [x.others for s in prof if (x := loop.sched.get(r, {}).get(s)) is not None and x.others is not None]
        if not got:
            continue
        runs = sum(o.runs for o in got)
        wire_ms = float(sent.nbytes[g.rank[sent.wait] == r].sum()) / steps / (rate * PAYLOAD_SHARE) * 1e3
        out[r] = {"cpu_ms": statistics.median(o.cpu_us for o in got) / 1e3, "runs": statistics.median(o.runs for o in got),
                  "wait_ms": statistics.median(o.wait_us for o in got) / 1e3, "cpu_per_run_us": sum(o.cpu_us for o in got) / max(runs, 1),
                  "wait_per_run_us": sum(o.wait_us for o in got) / max(runs, 1), "wire_ms": wire_ms,
                  "runs_per_wire_ms": statistics.median(o.runs for o in got) / wire_ms if wire_ms > 0 else float("nan")}
    return out


def main() -> int:
    from dagprof.costmodel.alphabeta import parse_bandwidth

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN:RATE")
    args = ap.parse_args()
    print(f"{'run':<60} {'rank':>4} {'cpu ms':>7} {'runs':>6} {'wait ms':>7} {'cpu/run':>8} {'wait/run':>8} {'wire ms':>7} {'runs/wire ms':>12}")
    for spec in args.runs:
        run, _, rate = spec.rpartition(":")
        for r, x in wakeups(run, parse_bandwidth(rate)).items():
            print(f"{run[-60:]:<60} {r:>4} {x['cpu_ms']:7.1f} {x['runs']:6.0f} {x['wait_ms']:7.1f} {x['cpu_per_run_us']:8.0f} "
                  f"{x['wait_per_run_us']:8.0f} {x['wire_ms']:7.1f} {x['runs_per_wire_ms']:12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
