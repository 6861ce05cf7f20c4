"""Judge ``roots_apply_rounds.sh``: per job, the speed-up of the applied strategy predicted from a profile (priced as
``optimize --verify`` prices each round's: ``search.fsdp_optimize.predict_fsdp``) beside the one measured (each round's
A over its B, rank 0's median step; the median over rounds and their spread).

    .venv/bin/python bench/fsdp_fresh/roots_apply_judge.py OUT --predict gan=RUN,STRATEGY a2c=RUN,STRATEGY
"""
from __future__ import annotations

import argparse
import os
import re
import statistics

from dagprof.collect.deploy.strategy import load_strategy
from dagprof.pipeline import open_run
from dagprof.search.fsdp_optimize import predict_fsdp

_STEP = re.compile(r"^(\w+) ([AB]) (\d+) load ([0-9.]+) median step ([0-9.]+) ms$")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--predict", nargs="*", default=[], help="JOB=RUN,STRATEGY: the profile that predicts, the strategy applied")
    args = ap.parse_args()
    ms: dict[tuple[str, str, int], float] = {}
    with open(os.path.join(args.out, "steps.txt")) as f:
        for line in f:
            if m := _STEP.match(line.strip()):
                ms[(m.group(1), m.group(2), int(m.group(3)))] = float(m.group(5))
    predicted = {}
    for kv in args.predict:
        job, _, paths = kv.partition("=")
        run, _, strategy = paths.partition(",")
        predicted[job] = predict_fsdp(open_run(run).graph, load_strategy(strategy))[0].speedup
    for job in sorted({k[0] for k in ms}):
        rounds = sorted({k[2] for k in ms if k[0] == job and (job, "A", k[2]) in ms and (job, "B", k[2]) in ms})
        ratios = [ms[(job, "A", r)] / ms[(job, "B", r)] for r in rounds]
        if not ratios:
            print(f"{job}: no round with both runs")
            continue
        med = statistics.median(ratios)
        pred = predicted.get(job)
        vs = f"; predicted {pred:.2f}x, error {100 * (pred / med - 1):+.1f} %" if pred else ""
        print(f"{job}: measured {med:.2f}x over {len(ratios)} rounds (per round {', '.join(f'{x:.2f}' for x in ratios)}; "
              f"A {statistics.median(ms[(job, 'A', r)] for r in rounds):.1f} ms, B {statistics.median(ms[(job, 'B', r)] for r in rounds):.1f} ms){vs}")


if __name__ == "__main__":
    main()
