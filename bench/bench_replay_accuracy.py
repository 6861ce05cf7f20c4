"""Replay accuracy on real 2-rank gloo DDP profiles (issue 2).

For each bucket size and repetition: profile the embedded demo job, replay its global graph
(every profiled step with its own op times: dagprof's default) and its template (each op at its
mean over the steps, dPRO's averaged replay), and compare both with the measured mean iteration
over the same steps. Prints one row per run, then the median and max |error| of each per bucket size.

    python bench/bench_replay_accuracy.py [--reps 3] [--buckets 1,25] [--steps 16]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile

from dagprof.collect.jobs.demo_train import run_demo_training
from dagprof.pipeline import open_run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--buckets", default="1,25", help="bucket_cap_mb values, comma separated")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    caps = [float(x) for x in args.buckets.split(",")]
    print(f"{'bucket MB':>9} {'rep':>4} {'buckets':>8} {'measured ms':>12} {'replay ms':>10} {'error %':>8} {'template ms':>12} {'error %':>8}")
    summary = {}
    for cap in caps:
        errs: dict[str, list[float]] = {"replay": [], "template": []}
        for rep in range(args.reps):
            with tempfile.TemporaryDirectory(prefix="dagprof-bench-") as d:
                run_demo_training(d, world_size=args.ranks, steps=args.steps, profile_steps=(6, args.steps - 2), bucket_cap_mb=cap)
                full = open_run(d).analysis
                tmpl = open_run(d, template=True).analysis
            nb = len(full.graph.meta.buckets)
            errs["replay"].append(abs(full.error_pct))
            errs["template"].append(abs(tmpl.error_pct))
            print(f"{cap:>9g} {rep:>4} {nb:>8} {full.measured_us / 1e3:>12.2f} {full.predicted_us / 1e3:>10.2f} {full.error_pct:>+8.2f} "
                  f"{tmpl.predicted_us / 1e3:>12.2f} {tmpl.error_pct:>+8.2f}", flush=True)
        summary[cap] = errs
    print()
    for cap, errs in summary.items():
        for kind, e in errs.items():
            print(f"bucket {cap:g} MB, {kind:>8}: median |error| {statistics.median(e):.2f} %, max {max(e):.2f} % over {len(e)} runs"
                  " (goal: median < 3 %, each <= 5 %)")


if __name__ == "__main__":
    main()
