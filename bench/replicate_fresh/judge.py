"""Predict each round of ``rounds.sh`` (the composable replicate() scripts) from its profile and hold it against the jobs
measured in the same round: ``whatif --workers 4 --cores 2`` against the job at 4 ranks on the machine's 2 cores. Each
cell: predicted ms, measured ms (rank 0's median step), error, and the change (predicted over the model of the profiled
run against measured 4 ranks over the job run as written at 2), which takes out the level the profiler and the load put
the profiled job at. Beside each, the same from the round's profile of the job under DistributedDataParallel (``ddp``
rows, the control: replicate() runs DDP's reducer, so its answers should be DDP's).

    .venv/bin/python bench/replicate_fresh/judge.py /tmp/rep/r* [--src TREE/src] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from whatif_cli import Refused, whatif_json  # noqa: E402

JOBS = ("wavenet_accum", "realnvp_tabular")
_STEP = re.compile(r"^(\w+) (\w+) load ([0-9.]+) median step ([0-9.]+) ms$")


def measured(round_dir: str) -> dict[tuple[str, str], float]:
    with open(os.path.join(round_dir, "steps.txt")) as f:
        return {(m.group(1), m.group(2)): float(m.group(4)) for line in f if (m := _STEP.match(line.strip()))}


def judge(round_dir: str, src: str | None) -> list[dict]:
    steps, rows = measured(round_dir), []
    for job in [j + w for j in JOBS for w in ("", ".ddp")]:
        run = os.path.join(round_dir, job)
        if not os.path.isdir(run):
            continue
        row = {"round": os.path.basename(round_dir), "job": job, "measured_as_ms": steps.get((job.split(".")[0], "as")),
               "measured_ms": steps.get((job.split(".")[0], "w4"))}
        with tempfile.TemporaryDirectory() as tmp:  # whatif writes beside its input: a copy
            try:
                d = whatif_json(shutil.copytree(run, os.path.join(tmp, job)), "--workers", "4", "--cores", "2", src=src)
            except Refused as e:
                rows.append(row | {"refused": str(e)})
                continue
        s = d["scenarios"][0]
        row |= {"predicted_ms": s["predicted_iter_ms"], "model_ms": d["model_iter_ms"], "profiled_ms": d["measured_iter_ms"]}
        if row["measured_ms"]:
            row["error_pct"] = 100 * (row["predicted_ms"] / row["measured_ms"] - 1)
            if row["measured_as_ms"]:
                row["change_error_pct"] = 100 * ((row["predicted_ms"] / row["model_ms"]) / (row["measured_ms"] / row["measured_as_ms"]) - 1)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", nargs="+")
    ap.add_argument("--src", default=None, help="the dagprof tree's src to predict with (default: this one's)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [r for d in a.rounds for r in judge(d, a.src)]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'round':<6} {'job (profile)':<20} {'as (2)':>9} {'model':>9} {'pred w4':>9} {'meas w4':>9} {'error':>8} {'change':>8}")
    for r in rows:
        if "refused" in r:
            print(f"{r['round']:<6} {r['job']:<20} refused: {r['refused']}")
            continue
        fmt = lambda v, f="9.1f": format(v, f) if v is not None else "-".rjust(9)  # noqa: E731
        print(f"{r['round']:<6} {r['job']:<20} {fmt(r['measured_as_ms'])} {fmt(r['model_ms'])} {fmt(r['predicted_ms'])} "
              f"{fmt(r['measured_ms'])} {fmt(r.get('error_pct'), '+7.1f')}% {fmt(r.get('change_error_pct'), '+7.1f')}%")
    for wrap, ddp in (("replicate()", False), ("DDP control", True)):
        errs = [abs(r["error_pct"]) for r in rows if "error_pct" in r and r["job"].endswith(".ddp") == ddp]
        changes = [abs(r["change_error_pct"]) for r in rows if "change_error_pct" in r and r["job"].endswith(".ddp") == ddp]
        if errs and changes:
            print(f"{wrap} profiles, {len(errs)} cells: |error| median {statistics.median(errs):.1f} %, max {max(errs):.1f} %; "
                  f"|change error| median {statistics.median(changes):.1f} %, max {max(changes):.1f} %")


if __name__ == "__main__":
    main()
