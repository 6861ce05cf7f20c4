"""PowerSGD's chained P and Q against the wake-ups the job's own profile shows (offline, on ``bench_optimize.py --keep`` folders).

Each verification round holds a profile of DDP's defaults (``roundK-A``) and one of the strategy run (``roundK-B``). From
the defaults' profile, the two wake-up prices a chain could read off the job itself: DDP's finalize waiting for the last
bucket, from that bucket's completion (its callback on gloo's thread) to the finalize's end (``handoff``: the wake of a
thread waiting on a gloo completion, as PowerSGD's callback waits on P and on Q), and gloo's threads' wait for a core per
time they got one (``traces.meta.OtherThreads``). Beside them the strategy run's own: its gloo threads' wait per run and per
step, and the chain's P and Q parts measured against main's price (``bench_psgd_rounds_split``), so a per-wake price can
be held against what the chain missed.

    python bench/psgd_handoff.py KEPT/sgns KEPT/gru4rec ...
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_psgd_rounds_split import SKIP, priced, split_run  # noqa: E402

from dagprof.pipeline import open_run  # noqa: E402
from dagprof.traces.events import Kind  # noqa: E402


def handoffs_us(run_dir: str) -> list[float]:
    """Per rank and step where DDP's finalize waited for the last bucket: that bucket's completion to the finalize's end, us."""
    out = []
    for r in open_run(run_dir).run.ranks:
        ev = r.events
        comm = np.flatnonzero((ev.kind == Kind.COMM) & (ev.bucket >= 0))
        ends = ev.start[comm] + ev.dur[comm]
        for i in np.flatnonzero(ev.kind == Kind.COMM_WAIT).tolist():
            s, e = ev.start[i], ev.start[i] + ev.dur[i]
            inside = ends[(ends > s) & (ends <= e)]
            if len(inside):
                out.append(float(e - inside.max()))
    return out


def gloo_waits(run_dir: str, skip: int = 0) -> tuple[float, float]:
    """(median ms a step, us a run) of the ranks' threads other than the training thread waiting for a core, over the
    profiled steps past the first ``skip`` (the strategy run's: PowerSGD's warm-up and first compressed step)."""
    steps, per_run = [], []
    for f in sorted(glob.glob(os.path.join(run_dir, "rank*.json"))):
        with open(f) as fh:
            doc = json.load(fh)
        window = doc["steps_profiled"][skip:]
        rows = [x for x in doc.get("other_threads_ns", []) if x[0] in window]
        steps += [w / 1e6 for _, _, w, _ in rows]
        runs = sum(n for *_, n in rows)
        if runs:
            per_run.append(sum(w for _, _, w, _ in rows) / runs / 1e3)
    return (statistics.median(steps) if steps else float("nan"), statistics.mean(per_run) if per_run else float("nan"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kept", nargs="+", help="bench_optimize --keep folders (each holds w*-* workload folders)")
    args = ap.parse_args()
    for kept in args.kept:
        for work in sorted(glob.glob(os.path.join(kept, "w*-*"))):
            verify = os.path.join(work, "lossy", "verify")
            k = 0
            while os.path.isdir(os.path.join(verify, f"round{k}-B")):
                a, b = os.path.join(verify, f"round{k}-A", "run"), os.path.join(verify, f"round{k}-B", "run")
                h = handoffs_us(a)
                wa, wb = gloo_waits(a), gloo_waits(b, SKIP)
                m = split_run(b)
                p = priced(work, a, os.path.join(work, "lossy", "strategy.json"))
                miss = [statistics.median(m[f"b{i}.{part}"]) - q[part] for i, q in enumerate(p) if f"b{i}.chain" in m for part in ("p", "q")]
                print(f"{work} round {k}: defaults' hand-off mean {np.mean(h) / 1e3:.2f} ms (min {min(h) / 1e3:.2f}, n {len(h)}); "
                      f"gloo's wait a run {wa[1]:.0f} us (defaults) {wb[1]:.0f} us (strategy), {wb[0]:.1f} ms a strategy step; "
                      f"P, Q measured over main's price per bucket {' '.join(f'{x:+.2f}' for x in miss)} ms")
                k += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
