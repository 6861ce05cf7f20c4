"""Predict each round of ``roots_rounds.sh`` (FSDP2 jobs of two ``fully_shard`` roots) from its profile and hold it against
the jobs measured in the same round: per script, ``whatif --reshard-after-forward off`` against the job run with every
unit's ``reshard_after_forward=False``, ``--workers 4 --cores 2`` against the job at 4 ranks on the machine's 2 cores, and
``--data-parallel ddp`` against the script's ``--ddp`` job (each trained model in its own DistributedDataParallel).
Each cell: predicted ms, measured ms (rank 0's median step), error; and the change (predicted over the model of the
profiled run against the measured over the job run as written), which takes out the level the profiler and the load put
the profiled job at. The replay of the measured configuration (the model's error on the profiled run) is printed beside.
With ``--memory DIR`` (``MEM.<cell>.<rank>`` files of the scripts' ``--memory``), each cell's predicted peak per rank
against the measured one (the largest step peak after the first three, the largest rank).

    .venv/bin/python bench/fsdp_fresh/roots_judge.py /tmp/roots/r* [--src TREE/src] [--json]
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

CELLS = {"off": ["--reshard-after-forward", "off"], "w4": ["--workers", "4", "--cores", "2"], "ddp": ["--data-parallel", "ddp"]}
_STEP = re.compile(r"^(\w+) (\w+) load ([0-9.]+) median step ([0-9.]+) ms$")


def measured(round_dir: str) -> dict[tuple[str, str], float]:
    out = {}
    with open(os.path.join(round_dir, "steps.txt")) as f:
        for line in f:
            if m := _STEP.match(line.strip()):
                out[(m.group(1), m.group(2))] = float(m.group(4))
    return out


def peak_mb(prefix: str) -> float | None:
    """The largest rank's largest step peak after the first three, MiB (the ``--memory`` files ``prefix.<rank>``)."""
    peaks = []
    for rank in range(8):
        if os.path.exists(f"{prefix}.{rank}"):
            with open(f"{prefix}.{rank}") as f:
                peaks.append(max(json.load(f)["step_peak_bytes"][3:]))
    return max(peaks) / 2 ** 20 if peaks else None


def judge(round_dir: str, src: str | None, memory: str | None) -> list[dict]:
    steps = measured(round_dir)
    rows = []
    for job in ("gan", "dino", "a2c"):
        run = os.path.join(round_dir, job)
        if not os.path.isdir(run):
            continue
        with tempfile.TemporaryDirectory() as tmp:  # whatif writes beside its input: a copy
            copy = shutil.copytree(run, os.path.join(tmp, job))
            for cell, args in CELLS.items():
                row = {"round": os.path.basename(round_dir), "job": job, "cell": cell,
                       "measured_as_ms": steps.get((job, "as")), "measured_ms": steps.get((job, cell))}
                try:
                    d = whatif_json(copy, *args, src=src)
                except Refused as e:
                    rows.append(row | {"refused": str(e)})
                    continue
                s = d["scenarios"][0]
                row |= {"predicted_ms": s["predicted_iter_ms"], "model_ms": d["model_iter_ms"], "profiled_ms": d["measured_iter_ms"],
                        "model_error_pct": d["model_error_pct"], "predicted_peak_mb": s["peak_memory_mb"]}
                if row["measured_ms"]:
                    row["error_pct"] = 100 * (row["predicted_ms"] / row["measured_ms"] - 1)
                    if row["measured_as_ms"]:
                        row["change_error_pct"] = 100 * ((s["predicted_iter_ms"] / d["model_iter_ms"]) / (row["measured_ms"] / row["measured_as_ms"]) - 1)
                if memory:
                    row["measured_peak_mb"] = peak_mb(os.path.join(memory, f"{job}.{cell}"))
                    row["measured_as_peak_mb"] = peak_mb(os.path.join(memory, f"{job}.as"))
                rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rounds", nargs="+")
    ap.add_argument("--src", help="the tree whose dagprof predicts (default: the one this Python imports)")
    ap.add_argument("--memory", help="the directory of the scripts' --memory files (job.cell.rank)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [r for d in args.rounds for r in judge(d, args.src, args.memory)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        if "refused" in r:
            print(f"{r['round']} {r['job']:5} {r['cell']:4} refused: {r['refused']}")
            continue
        mem = f"  peak {r['predicted_peak_mb']:.2f} MiB / {r['measured_peak_mb']:.2f}" if r.get("measured_peak_mb") else ""
        print(f"{r['round']} {r['job']:5} {r['cell']:4} predicted {r['predicted_ms']:7.1f} measured {r['measured_ms'] or 0:7.1f} ms "
              f"error {r.get('error_pct', float('nan')):+6.1f} %  change error {r.get('change_error_pct', float('nan')):+6.1f} %  "
              f"(replay of the profile {r['model_error_pct']:+.1f} %, as written {r['measured_as_ms'] or 0:.1f} ms){mem}")
    for key in ("error_pct", "change_error_pct"):
        errs = [abs(r[key]) for r in rows if key in r]
        if errs:
            print(f"median |{key}| {statistics.median(errs):.1f} % over {len(errs)} cells, within 8 %: {sum(e <= 8 for e in errs)}")


if __name__ == "__main__":
    main()
