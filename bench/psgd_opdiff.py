"""Where a PowerSGD strategy run computes faster than its round's wire-bound defaults, op by op, and whether the
defaults' profile alone says how much (the same op timed with a collective in flight and with none).

Runs nothing: reads ``bench_optimize.py --keep`` folders. Each lossy round holds a profile of DDP's defaults (A, bound
by the 200 Mbit/s wire) and one of the PowerSGD strategy (B, bound by compute), back to back on the same ranks. Per
round, every compute op (rank, kind, name) is its median over steps in A and in B, and A's replayed timeline says how
much of it had a collective in flight (``passes.overlap.comm_overlap``); the ops are summed by part, B over A:

- ``fwd``: the forward, ``opt``: the optimizer step (DDP runs both with no collective in flight in either run),
- ``bwd beside`` / ``bwd alone``: backward ops with a collective in flight for over half / under a tenth of their time in A,
- ``gaps``: the Python between ops (``other:*``; B's holds PowerSGD's hook issue too), and ``all``: every compute op.

The lead tested (issue 20, branch psgd60): gloo's threads compete with the backward on 2 cores, so ops beside a wire-bound
collective run slower in A than in B; if the defaults' profile tells how much, by the same backward op (the same layer)
timed in some steps or ranks with a collective in flight and in others with none, that ``contention`` factor would say
how much faster the strategy computes. Printed per cell: its pairs and their in-flight over none ratio (median; in the
rounds' A profiles and in the searched profile the optimizer priced), beside each part's B / A (median over all rounds,
and ``all`` over the quiet ones: both runs' training threads waited for a core under 15 % of their CPU) and the
strategy side's error (``bench_optimize.py --repredict --out KEPT.rep.json``'s: the strategy's measured step over its
prediction from the round's A), ``--rounds`` each round's:

    python bench/psgd_opdiff.py KEPT [KEPT ...] [--rounds] [--json OUT]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

import numpy as np
from bench_overlap_ops import QUIET, median_sched

from dagprof.errors import DagprofError
from dagprof.passes.overlap import comm_overlap, slowed_nodes
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.events import Kind

PARTS = ("fwd", "opt", "bwd beside", "bwd alone", "gaps", "all")
BESIDE, ALONE = 0.5, 0.1  # in flight for over half of an op's time / under a tenth


def ops(run_dir: str) -> tuple[dict[tuple[int, int, str], tuple[float, float]], dict[str, list[tuple[float, float]]], bool]:
    """Per (rank, kind, name) of a profiled run's compute: its per-step total's median over steps (us) and its mean
    in-flight share; per backward op (its layer's name) every rank's and step's (duration, in-flight share), the pairs
    ``contention`` reads; and whether the run was quiet
    (its training threads waited for a core under ``bench_overlap_ops.QUIET`` of their CPU)."""
    p = open_run(run_dir)
    g = p.graph
    sched = median_sched(p.run)
    nodes = slowed_nodes(g)
    nodes = nodes[g.step[nodes] >= 0]
    share = comm_overlap(g, replay(g), nodes)
    per: dict[tuple[int, int, str], dict[int, list[float]]] = {}
    same: dict[tuple[int, str, int], list[tuple[float, float]]] = {}
    for i, n in enumerate(nodes):
        name = g.names[g.name[n]].split(".", 1)[-1]
        key = (int(g.rank[n]), int(g.kind[n]), name)
        per.setdefault(key, {}).setdefault(int(g.step[n]), []).extend((float(g.dur[n]), float(share[i])))
        if g.kind[n] == Kind.BACKWARD:
            same.setdefault(name, []).append((float(g.dur[n]), float(share[i])))
    out = {}
    for key, steps in per.items():
        tot = [sum(v[0::2]) for v in steps.values()]
        shares = [s for v in steps.values() for s in v[1::2]]
        out[key] = (float(np.median(tot)), float(np.mean(shares)))
    return out, same, bool(sched["wait_ms"] < QUIET * sched["cpu_ms"])


def part_of(kind: int, name: str, share: float) -> str | None:
    if kind == Kind.FORWARD:
        return "fwd"
    if kind == Kind.UPDATE:
        return "opt"
    if kind == Kind.BACKWARD:
        return "bwd beside" if share > BESIDE else "bwd alone" if share < ALONE else None
    return "gaps" if name.startswith("other:") else None


def parts(a: dict, b: dict) -> dict[str, tuple[float, float]]:
    """Each part's A and B totals (us a step, ranks summed), the part read off A's in-flight shares."""
    out = {p: [0.0, 0.0] for p in PARTS}
    for key in a.keys() & b.keys():
        p = part_of(key[1], key[2], a[key][1])
        for q in ([p] if p else []) + ["all"]:
            out[q][0] += a[key][0]
            out[q][1] += b[key][0]
    return {p: (x, y) for p, (x, y) in out.items()}


def contention(same: dict[str, list[tuple[float, float]]]) -> list[float]:
    """Per backward op timed in some steps or ranks with a collective in flight (over half its time) and in others with
    none (under a tenth): median over median. The same layer, so the same shapes: nothing but what ran beside it differs."""
    out = []
    for v in same.values():
        beside = [d for d, s in v if s > BESIDE]
        alone = [d for d, s in v if s < ALONE]
        if beside and alone:
            out.append(statistics.median(beside) / statistics.median(alone))
    return out


def cell_table(cell: str, rows: dict | None) -> dict:
    rounds = []
    for a in sorted(glob.glob(os.path.join(cell, "lossy", "verify", "round*-A"))):
        (oa, same, qa), (ob, _, qb) = ops(os.path.join(a, "run")), ops(os.path.join(a[:-1] + "B", "run"))
        rounds.append({"round": os.path.basename(a)[:-2], "parts": parts(oa, ob), "contention": contention(same), "quiet": qa and qb})
    if not rounds:
        raise DagprofError("no lossy verification round", cell)
    ratio = {p: statistics.median(r["parts"][p][1] / r["parts"][p][0] for r in rounds if r["parts"][p][0] > 0)
             if any(r["parts"][p][0] > 0 for r in rounds) else None for p in PARTS}
    quiet = [r for r in rounds if r["quiet"]]
    quiet_all = statistics.median(r["parts"]["all"][1] / r["parts"]["all"][0] for r in quiet) if quiet else None
    share = {p: statistics.median(r["parts"][p][0] / r["parts"]["all"][0] for r in rounds) for p in PARTS}
    pairs = [x for r in rounds for x in r["contention"]]
    searched = contention(ops(os.path.join(cell, "run"))[1]) if os.path.isdir(os.path.join(cell, "run")) else []
    return {"cell": cell, "rounds": rounds, "b_over_a": ratio, "quiet_rounds": len(quiet), "quiet_b_over_a_all": quiet_all, "a_share": share,
            "contention_pairs": len(pairs),
            "contention": statistics.median(pairs) if pairs else None, "searched_contention_pairs": len(searched),
            "searched_contention": statistics.median(searched) if searched else None,
            "strategy_side_pct": statistics.median(rows["strategy_side_pct_per_round"]) if rows else None,
            "median_error_pct": rows["median_error_pct"] if rows else None}


def repredicted(kept: str) -> dict[str, dict]:
    """``bench_optimize.py --repredict``'s lossy rows kept beside the folder (``KEPT.rep.json``), by cell; none: {}."""
    f = kept.rstrip(os.sep) + ".rep.json"
    if not os.path.exists(f):
        return {}
    rows = json.load(open(f))["rows"]
    return {f"w{i}-{r['ranks']}": r for i, r in enumerate(r for r in rows if r["mode"] == "lossy")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kept", nargs="+", help="bench_optimize.py --keep folders (their wI-R cells' lossy rounds are read)")
    ap.add_argument("--json", default=None, help="write every round's parts here")
    ap.add_argument("--rounds", action="store_true", help="also each round: its parts' B / A and its A profile's contention")
    args = ap.parse_args()
    table = []
    try:
        for kept in args.kept:
            rep = repredicted(kept)
            for cell in sorted(glob.glob(os.path.join(kept, "w*-*"))):
                table.append(cell_table(cell, rep.get(os.path.basename(cell))) | {"name": os.path.basename(kept.rstrip(os.sep))})
    except (OSError, ValueError) as e:
        raise SystemExit(f"psgd_opdiff: {e}") from None
    except DagprofError as e:
        raise SystemExit(str(e)) from None

    def fmt(x, f="{:.2f}"):
        return "-" if x is None else f.format(x)
    print("per cell, median over lossy rounds: each part's B (PowerSGD) over A (defaults), A's share of its compute in [];")
    print("the defaults' profile alone: the same backward op in flight over with none (pairs); the strategy side's error")
    print(f"{'cell':10s} " + " ".join(f"{p:>17s}" for p in PARTS)
          + f" {'quiet all':>11s} {'contention (n)':>15s} {'searched (n)':>13s} {'strat side':>10s} {'round err':>9s}")
    for t in table:
        print(f"{t['name']:10s} " + " ".join(f"{fmt(t['b_over_a'][p]):>9s} [{100 * t['a_share'][p]:4.1f}%]" for p in PARTS)
              + f" {fmt(t['quiet_b_over_a_all']):>6s} ({t['quiet_rounds']}/{len(t['rounds'])})"
              + f" {fmt(t['contention']):>10s} ({t['contention_pairs']:2d}) {fmt(t['searched_contention']):>8s} ({t['searched_contention_pairs']:2d})"
              + f" {fmt(t['strategy_side_pct'], '{:+.1f}%'):>10s}"
              + f" {fmt(t['median_error_pct'], '{:+.1f}%'):>9s}")
        for r in t["rounds"] if args.rounds else []:
            c = r["contention"]
            print(f"  {r['round']:8s} " + " ".join(f"{p} {r['parts'][p][1] / r['parts'][p][0]:.2f}" if r["parts"][p][0] > 0 else f"{p} -" for p in PARTS)
                  + f"; contention {fmt(statistics.median(c) if c else None)} ({len(c)}){'; quiet' if r['quiet'] else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cells": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
