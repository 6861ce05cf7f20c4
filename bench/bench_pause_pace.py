"""Does a rank's compute after it waited for the wire run slower the longer it waited? Read inside kept profiles, no job.

Runs nothing: reads ``bench_optimize.py --keep`` folders (each cell's searched profile ``run`` and every verification
round's ``{lossless,lossy}/verify/round<k>-{A,B}/run``, hooks only). Per profiled run, rank and step ``s``: the pause (the
training thread's wait for the buckets, ``COMM_WAIT`` on the main thread in step ``s``), the compute right after it (the
optimizer of ``s`` and the forward of ``s + 1``, each op over the same op's median in that run: ``after``) and the compute
before it (the forward and backward of ``s``: ``before``, the pace the rank already had). Per script:

- *within runs*: log ``after`` on the pause with each run's means taken out, the rank's own ``before`` and the other
  ranks' ``before`` of the same step beside it (a slow stretch of the machine both lengthens a rank's wait for the slower
  rank and slows what follows), by the kind of run (the searched profile and the defaults' runs wait 170-420 ms for the
  wire, the PowerSGD runs 3-32 ms);
- *between runs*: per round and rank the defaults' run (A) over the strategy's (B), median optimizer and median next
  forward, the lossless rounds (both runs wire-bound) as the control.

    .venv/bin/python bench/bench_pause_pace.py KEPT [KEPT ...] [--json FILE]

On the 15 kept PowerSGD folders of 2026-12-05/06 (295 runs, 6,890 rank-steps; docs/evidence.md, branch psgdpace), in %
of compute per 10 ms of pause: within the defaults' wire-bound runs (pauses 166-418 ms, sd 6-13 ms within a run) conv
-0.2 +- 0.5, LSTM +0.6 +- 0.5, encoder +0.8 +- 0.9, embedding -4.5 +- 2.0, tied LM +3.7 +- 2.5, two-tower -3.4 +- 2.7:
no dependence a profile of the defaults could price; within the PowerSGD runs (pauses 1-42 ms) conv +3.2 +- 0.5, LSTM
+2.6 +- 0.6, encoder +0.9 +- 0.7, embedding +6.7 +- 1.6, tied LM -4.8 +- 3.1, two-tower +1.1 +- 1.5: not one function.
Between runs the same two pauses (166-399 ms against 12-20 ms) gave the optimizer x1.21 (embedding), x1.14 (tied LM),
x0.92 (two-tower), x1.00 / 1.07 / 1.04 (conv, LSTM, encoder), the lossless rounds x0.86-1.04: the pause does not set it.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass

import numpy as np

from dagprof.errors import DagprofError
from dagprof.pipeline import open_run
from dagprof.traces.events import Kind

SIDES = ("searched", "lossless-A", "lossless-B", "lossy-A", "lossy-B")


@dataclass(frozen=True)
class Point:
    """One rank's step: its wait for the wire and the compute on either side of it (paces: over the run's op medians)."""

    rank: int
    step: int
    pause_ms: float
    after: float  # the optimizer of the step and the next forward
    before: float  # the step's forward and backward
    update_ms: float
    next_forward_ms: float


def pause_points(run_dir: str) -> list[Point]:
    """Every (rank, step) of a profiled run with a next step in the window (the main thread's top-level ops)."""
    run = open_run(run_dir).run
    per_op: dict[tuple[int, str], list[float]] = {}
    kinds = [int(Kind.FORWARD), int(Kind.BACKWARD), int(Kind.UPDATE)]
    tops = []
    for t in run.ranks:
        e = t.events
        main = [i for i, lane in enumerate(t.lanes) if lane.main]
        top = np.isin(e.lane, main) & (e.depth == 0) & (e.step >= 0)
        for i in np.flatnonzero(top & np.isin(e.kind, kinds)):
            per_op.setdefault((int(e.kind[i]), e.names[e.name[i]]), []).append(float(e.dur[i]))
        tops.append((t.rank, e, top))
    median = {k: float(np.median(v)) for k, v in per_op.items()}
    out = []
    for rank, e, top in tops:
        steps = set(e.step[top].tolist())

        def part(s: int, want: tuple[Kind, ...], e=e, top=top) -> tuple[float, float]:
            idx = np.flatnonzero(top & (e.step == s) & np.isin(e.kind, [int(k) for k in want]))
            return float(e.dur[idx].sum()), sum(median[(int(e.kind[i]), e.names[e.name[i]])] for i in idx)

        for s in sorted(steps):
            if s + 1 not in steps:
                continue
            (u, um), (f, fm), (b, bm) = part(s, (Kind.UPDATE,)), part(s + 1, (Kind.FORWARD,)), part(s, (Kind.FORWARD, Kind.BACKWARD))
            if um > 0 and fm > 0 and bm > 0:
                wait = float(e.dur[top & (e.step == s) & (e.kind == int(Kind.COMM_WAIT))].sum())
                out.append(Point(rank, s, wait / 1e3, (u + f) / (um + fm), b / bm, u / 1e3, f / 1e3))
    return out


def within_runs(runs: list[list[Point]]) -> dict | None:
    """Log ``after`` on the pause, each run's means out, with the rank's own and the other ranks' ``before`` beside it:
    the slope per 100 ms of pause (log units) and its standard error; None under 8 points."""
    xs, ys, pauses = [], [], []
    for pts in runs:
        by_step: dict[int, list[Point]] = {}
        for q in pts:
            by_step.setdefault(q.step, []).append(q)
        rows = [(q.pause_ms, np.log(q.after), np.log(q.before), np.log(statistics.mean(o.before for o in others)))
                for q in pts if (others := [o for o in by_step[q.step] if o.rank != q.rank])]
        if len(rows) < 4:
            continue
        a = np.array(rows)
        pauses.append(a[:, 0])
        a = a - a.mean(axis=0)
        xs.append(a[:, [0, 2, 3]])
        ys.append(a[:, 1])
    if sum(len(y) for y in ys) < 8:
        return None
    x, y, p = np.vstack(xs), np.concatenate(ys), np.concatenate(pauses)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    res = y - x @ coef
    se = np.sqrt(np.diag(res @ res / (len(y) - 3) * np.linalg.inv(x.T @ x)))
    return {"runs": len(xs), "points": len(y), "pause_p5_ms": float(np.percentile(p, 5)), "pause_p95_ms": float(np.percentile(p, 95)),
            "pause_sd_within_ms": float(x[:, 0].std()), "slope_per_100ms": 100 * float(coef[0]), "se_per_100ms": 100 * float(se[0]),
            "own_before": float(coef[1]), "others_before": float(coef[2])}


def between_runs(rounds: list[tuple[list[Point], list[Point]]]) -> dict | None:
    """Per round and rank, the defaults' run (A) over the strategy's (B): median optimizer and median next forward, and
    each run's median pause; medians over rank-rounds."""
    rows = []
    for a, b in rounds:
        for r in {q.rank for q in a} & {q.rank for q in b}:
            qa, qb = [q for q in a if q.rank == r], [q for q in b if q.rank == r]
            rows.append([statistics.median(q.update_ms for q in qa) / statistics.median(q.update_ms for q in qb),
                         statistics.median(q.next_forward_ms for q in qa) / statistics.median(q.next_forward_ms for q in qb),
                         statistics.median(q.pause_ms for q in qa), statistics.median(q.pause_ms for q in qb)])
    if not rows:
        return None
    m = np.median(np.array(rows), axis=0)
    return {"rank_rounds": len(rows), "update_a_over_b": float(m[0]), "next_forward_a_over_b": float(m[1]),
            "pause_a_ms": float(m[2]), "pause_b_ms": float(m[3])}


def kept_runs(kept: str) -> list[dict]:
    """Every profiled run of a ``--keep`` folder: its cell, script (the manifest's argv), side (``SIDES``), round and points."""
    out = []
    for cell in sorted(glob.glob(os.path.join(kept, "w*-*"))):
        rounds = sorted(glob.glob(os.path.join(cell, "*", "verify", "round*-[AB]")))
        found = [m for d in [cell, *rounds] if os.path.exists(m := os.path.join(d, "run", "manifest.json"))]
        if not found:
            continue
        with open(found[0]) as f:
            script = os.path.basename((json.load(f).get("argv") or ["?"])[0])
        if os.path.isdir(os.path.join(cell, "run")):  # a vendored round may come without its searched profile
            out.append({"cell": cell, "script": script, "side": "searched", "round": None, "points": pause_points(os.path.join(cell, "run"))})
        for d in rounds:
            mode, name = d.split(os.sep)[-3], os.path.basename(d)
            out.append({"cell": cell, "script": script, "side": f"{mode}-{name[-1]}", "round": f"{mode}/{name[:-2]}",
                        "points": pause_points(os.path.join(d, "run"))})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kept", nargs="+", help="bench_optimize.py --keep folders")
    ap.add_argument("--json", default=None, help="write every table here")
    args = ap.parse_args()
    try:
        runs = [r for k in args.kept for r in kept_runs(k)]
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench_pause_pace: {e}") from None
    except DagprofError as e:
        raise SystemExit(str(e)) from None
    table = []
    for script in sorted({r["script"] for r in runs}):
        mine = [r for r in runs if r["script"] == script]
        line = {"script": script, "within": {side: within_runs([r["points"] for r in mine if r["side"] == side]) for side in SIDES}}
        for mode in ("lossless", "lossy"):
            pairs = {}
            for r in mine:
                if r["side"].startswith(mode):
                    pairs.setdefault((r["cell"], r["round"]), {})[r["side"][-1]] = r["points"]
            line[f"between_{mode}"] = between_runs([(p["A"], p["B"]) for p in pairs.values() if set(p) == {"A", "B"}])
        table.append(line)
    print("within runs: log(compute after the pause) on the pause, per 100 ms (each run's means out, both ranks' pace before beside it)")
    for t in table:
        print(t["script"])
        for side, w in t["within"].items():
            if w:
                print(f"  {side:10s} {w['runs']:3d} runs {w['points']:5d} points, pause {w['pause_p5_ms']:6.1f}-{w['pause_p95_ms']:6.1f} ms "
                      f"(sd within {w['pause_sd_within_ms']:4.1f}): {w['slope_per_100ms']:+.3f} +- {w['se_per_100ms']:.3f}; "
                      f"own before {w['own_before']:+.2f}, other ranks' {w['others_before']:+.2f}")
        for mode in ("lossless", "lossy"):
            if b := t[f"between_{mode}"]:
                print(f"  between {mode:8s} A/B over {b['rank_rounds']} rank-rounds: optimizer x{b['update_a_over_b']:.3f}, next forward "
                      f"x{b['next_forward_a_over_b']:.3f}; pause A {b['pause_a_ms']:.0f} ms, B {b['pause_b_ms']:.0f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scripts": table, "runs": [{**r, "points": [asdict(q) for q in r["points"]]} for r in runs]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
