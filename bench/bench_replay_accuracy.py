"""Replay accuracy on real 2-rank gloo DDP profiles (issue 2).

For each bucket size and repetition: profile the embedded demo job, replay its template
iteration (every op at its mean over the profiled steps), and compare with the measured mean
iteration over the same steps. Prints one row per run, then the median and max |error| per
bucket size. The op-for-op replay (--exact) is printed beside it as the floor.

    python bench/bench_replay_accuracy.py [--reps 3] [--buckets 1,25] [--steps 16]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile

from dagprof.collect.demo_train import run_demo_training
from dagprof.pipeline import open_run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--buckets", default="1,25", help="bucket_cap_mb values, comma separated")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    caps = [float(x) for x in args.buckets.split(",")]
    print(f"{'bucket MB':>9} {'rep':>4} {'buckets':>8} {'measured ms':>12} {'template ms':>12} {'error %':>8} {'exact err %':>12}")
    summary = {}
    for cap in caps:
        errs = []
        for rep in range(args.reps):
            with tempfile.TemporaryDirectory(prefix="dagprof-bench-") as d:
                run_demo_training(d, world_size=args.ranks, steps=args.steps, profile_steps=(6, args.steps - 2), bucket_cap_mb=cap)
                tmpl = open_run(d).analysis
                exact = open_run(d, exact=True).analysis
            nb = len(tmpl.graph.meta.get("buckets", []))
            errs.append(abs(tmpl.error_pct))
            print(f"{cap:>9g} {rep:>4} {nb:>8} {tmpl.measured_us / 1e3:>12.2f} {tmpl.predicted_us / 1e3:>12.2f} {tmpl.error_pct:>+8.2f} {exact.error_pct:>+12.2f}", flush=True)
        summary[cap] = errs
    print()
    for cap, errs in summary.items():
        print(f"bucket {cap:g} MB: median |error| {statistics.median(errs):.2f} %, max {max(errs):.2f} % over {len(errs)} runs (goal: median < 3 %, each <= 5 %)")


if __name__ == "__main__":
    main()
