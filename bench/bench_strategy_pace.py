"""Is a strategy run's compute pace the strategy's own, or the machine's load? Per kept verification round, the strategy's run
against the same round's run of the defaults, op kind by op kind.

Runs nothing: reads ``bench_optimize.py --keep`` folders (``KEPT/w<i>-<ranks>/{lossless,lossy}/verify/round<k>-{A,B}``, every
phase profiled by dagprof's hooks). Per round and rank: the median step's forward, backward and optimizer ops (each summed
over the step), and the training thread's stretch (its CPU plus its waits for a core, over its CPU: the load it met). The
lossless rows are the control: two wire-bound runs of nearly one setup (the defaults and the search's best layout), so what
spreads there is the machine. Pooled over rank-rounds, the geometric mean and the sd of the log of each B/A; then, per kept
folder, the lossy rows' mean log B/A less the lossless rows' (the strategy's own part), averaged over folders with a 90 %
bootstrap over them (rounds of one folder share its load), also with the forward over the stretch (the waits taken out).
Then how far one cell's rounds measured its speed-up from one another (``reproducibility``): what a prediction within 5 %
can hope for when the measurement itself moves round to round:

    .venv/bin/python bench/bench_strategy_pace.py KEPT... [--json FILE]

On the 11 kept PowerSGD folders of 2026-12-05 (embedding, conv, LSTM; 2 ranks, 200 Mbit/s; load 1.4-27): the spread is
the control's (sd of the log forward 0.47 lossless, 0.42 lossy); the PowerSGD runs' forward x0.78 of the control's
(x0.68-0.90), x0.81 (x0.75-0.87) with the waits taken out: faster, not slower (docs/evidence.md). With a 12th folder (the
embedding round of 14:52) x0.84 (x0.71-1.01) and x0.89 (x0.77-1.06): not told apart from the load. Rounds of one cell against
each other: the PowerSGD speed-up's sd of the log 0.30 (the strategy's step 0.26, the defaults' 0.10), two rounds within 5 %
of each other in 1 of 19 pairs, so a prediction exact on a cell's mean would be within 5 % of 13 % of rounds; lossless
0.16, 7 of 24 pairs, 23 %.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys

from dagprof.collect.hooks.steptimes import iteration_ms, read_times
from dagprof.errors import DagprofError
from dagprof.pipeline import open_run
from dagprof.traces.events import Kind

PARTS = {"forward": Kind.FORWARD, "backward": Kind.BACKWARD, "optimizer": Kind.UPDATE}
RESAMPLES = 4000
WITHIN = 0.05  # the goal's tolerance on a predicted speed-up (issue 20)


def per_rank(path: str) -> dict[int, dict[str, float]]:
    """Per rank: each part's median over the profiled steps (ms, the step's ops summed) and the training thread's stretch."""
    p = open_run(path)
    g = p.graph
    out: dict[int, dict[str, float]] = {}
    for t in p.run.ranks:
        on = g.rank == t.rank
        steps = sorted(set(g.step[on & (g.step >= 0)].tolist()))
        d = {name: statistics.median(float(g.dur[on & (g.kind == kind) & (g.step == s)].sum()) for s in steps) / 1e3 for name, kind in PARTS.items()}
        cpu = sum(x.cpu_us for x in t.meta.train_thread)
        d["stretch"] = (cpu + sum(x.wait_us for x in t.meta.train_thread)) / cpu if cpu > 0 else math.nan
        out[t.rank] = d
    return out


def rows_of(kept: str) -> list[dict]:
    """Every verification round of every cell of a ``--keep`` folder: per rank, the log of B over A of each part."""
    rows = []
    for cell in sorted(d for d in os.listdir(kept) if d.startswith("w") and os.path.isdir(os.path.join(kept, d))):
        for mode in ("lossless", "lossy"):
            k = 0
            while os.path.isdir((base := os.path.join(kept, cell, mode, "verify", f"round{k}")) + "-B"):
                try:
                    a, b = per_rank(base + "-A/run"), per_rank(base + "-B/run")
                except DagprofError as e:  # a round cut short: said, left out
                    print(f"{base}: {e}", file=sys.stderr)
                    k += 1
                    continue
                for r in a.keys() & b.keys():
                    rows.append({"kept": kept, "cell": cell, "mode": mode, "round": k, "rank": r,
                                 **{f"log_{x}": math.log(b[r][x] / a[r][x]) for x in (*PARTS, "stretch") if a[r][x] > 0 and b[r][x] > 0}})
                k += 1
    return rows


def rounds_of(kept: str) -> list[dict]:
    """Every cell and mode of a ``--keep`` folder with two rounds or more: each round's measured steps (ms, as
    ``bench_optimize.py`` measures them: the slowest rank's median) of the defaults (A) and the strategy (B)."""
    out = []
    for cell in sorted(d for d in os.listdir(kept) if d.startswith("w") and os.path.isdir(os.path.join(kept, d))):
        for mode in ("lossless", "lossy"):
            a, b, k = [], [], 0
            while os.path.isdir((base := os.path.join(kept, cell, mode, "verify", f"round{k}")) + "-B"):
                try:
                    ab = iteration_ms(read_times(base + "-A/times")), iteration_ms(read_times(base + "-B/times"))
                except DagprofError as e:  # a round cut short: said, left out
                    print(f"{base}: {e}", file=sys.stderr)
                else:
                    a.append(ab[0])
                    b.append(ab[1])
                k += 1
            if len(b) >= 2:
                out.append({"kept": kept, "cell": cell, "mode": mode, "defaults_ms": a, "strategy_ms": b})
    return out


def reproducibility(cells: list[dict], mode: str) -> dict[str, float] | None:
    """How far one setup's rounds, seconds apart, measured its speed-up from one another: the within-cell sd of the log of
    the defaults' step, the strategy's and the speed-up, pooled over ``mode``'s cells (weighted by their degrees of
    freedom); the share of pairs of rounds of one cell whose speed-ups agree within ``WITHIN``; and the share of rounds a
    prediction exact on the cell's mean would land within ``WITHIN`` of, were a round's log speed-up normal about it with
    the pooled sd. None under two cells."""
    got = [c for c in cells if c["mode"] == mode]
    if len(got) < 2:
        return None
    logs = {key: [[math.log(x) for x in xs] for xs in vals] for key, vals in (
        ("defaults", [c["defaults_ms"] for c in got]), ("strategy", [c["strategy_ms"] for c in got]),
        ("speedup", [[a / b for a, b in zip(c["defaults_ms"], c["strategy_ms"])] for c in got]))}
    dof = sum(len(c["strategy_ms"]) - 1 for c in got)
    out = {f"sd_{key}": math.sqrt(sum((len(xs) - 1) * statistics.variance(xs) for xs in v) / dof) for key, v in logs.items()}
    pairs = [abs(x - y) for xs in logs["speedup"] for i, x in enumerate(xs) for y in xs[i + 1:]]
    out["pairs_within"] = sum(d <= math.log(1 + WITHIN) for d in pairs) / len(pairs)
    out["exact_within"] = 2 * statistics.NormalDist().cdf(math.log(1 + WITHIN) / out["sd_speedup"]) - 1 if out["sd_speedup"] > 0 else 1.0
    out["cells"], out["rounds"], out["pairs"] = len(got), dof + len(got), len(pairs)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kept", nargs="+", help="bench_optimize.py --keep folders")
    ap.add_argument("--json", default=None, help="write every rank-round's logs here")
    args = ap.parse_args()
    rows = [r for k in args.kept for r in rows_of(k)]
    keys = [f"log_{x}" for x in PARTS]
    for mode in ("lossless", "lossy"):
        got = [r for r in rows if r["mode"] == mode]
        for key in keys:
            xs = [r[key] for r in got if key in r]
            if len(xs) >= 2:
                print(f"{mode:>8} {key[4:]:>9} B/A: x{math.exp(statistics.mean(xs)):.2f} (sd of the log {statistics.stdev(xs):.2f}, {len(xs)} rank-rounds)")
    # the strategy's own part, folder by folder: its load is shared by both modes' rounds
    ratio = [(key, lambda r, key=key: r[key]) for key in keys] + [("log_forward over stretch", lambda r: r["log_forward"] - r["log_stretch"])]
    folders = sorted({(r["kept"], r["cell"]) for r in rows})
    rng = random.Random(0)
    for name, f in ratio:
        diffs = []
        for folder in folders:
            sides = [[f(r) for r in rows if (r["kept"], r["cell"]) == folder and r["mode"] == mode and "log_stretch" in r and "log_forward" in r]
                     for mode in ("lossless", "lossy")]
            if all(sides):
                diffs.append(statistics.mean(sides[1]) - statistics.mean(sides[0]))
        if len(diffs) < 2:
            continue
        boots = sorted(statistics.mean(rng.choice(diffs) for _ in diffs) for _ in range(RESAMPLES))
        lo, hi = boots[int(0.05 * RESAMPLES)], boots[int(0.95 * RESAMPLES)]
        print(f"lossy over lossless, {name[4:]}: x{math.exp(statistics.mean(diffs)):.2f} (90 % over {len(diffs)} folders "
              f"x{math.exp(lo):.2f}-{math.exp(hi):.2f})")
    cells = [c for k in args.kept for c in rounds_of(k)]
    for mode in ("lossless", "lossy"):
        if (r := reproducibility(cells, mode)) is not None:
            print(f"{mode:>8} rounds of one cell against each other ({r['cells']} cells, {r['rounds']} rounds): sd of the log of the "
                  f"defaults' step {r['sd_defaults']:.3f}, the strategy's {r['sd_strategy']:.3f}, the speed-up {r['sd_speedup']:.3f}; "
                  f"speed-ups within {100 * WITHIN:.0f} % of each other in {100 * r['pairs_within']:.0f} % of {r['pairs']} pairs; "
                  f"an exact prediction within {100 * WITHIN:.0f} % of {100 * r['exact_within']:.0f} % of rounds")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rank_rounds": rows, "cells": cells}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
