"""What lies between a TF profile's model and the job's unprofiled steps (no job, no root): per kept run, the model of the
profiled configuration (``dagprof whatif RUN --json``, no change: its mean step and its replayed median) against the
job's unprofiled median step (``LoopSteps.unprofiled``, past the warm-up), split into the script's own time between the
steps dagprof times (``passes.profiler_cost.between_steps_us``: the trace's mark-to-mark steps less the collector's
timing, which the model holds and the unprofiled steps do not) and the rest; beside it the profiler's cost as measured
(profiled against unprofiled median step, corrected or why not) and per trace event of a step and rank (the window's
excess of wall step and of process CPU, where recorded).

    PYTHONPATH=src python bench/tf_profiler_cost_split.py RUN... [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from whatif_cli import Refused, whatif_json  # noqa: E402

from dagprof.errors import DagprofError  # noqa: E402
from dagprof.passes.profiler_cost import job_sched, job_steps, measure_profiler_cost, resumed_step, steady_from  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402


def split(run: str) -> dict:
    """One run's row (``error`` where it has no unprofiled steps or the model is refused)."""
    g = open_run(run).graph
    loop = g.meta.loop_steps
    if loop is None:
        return {"run": run, "error": "no unprofiled steps timed"}
    base = job_steps(loop.unprofiled, None, g.meta.job_of, steady_from(loop), resumed_step(loop))
    if not base:
        return {"run": run, "error": "no unprofiled steps past the warm-up"}
    cost = measure_profiler_cost(g)
    try:
        d = whatif_json(run)
    except Refused as e:
        return {"run": run, "error": str(e)}
    u = statistics.median(base) / 1e3
    mean, median = d["model_iter_ms"], d["scenarios"][0]["predicted_median_ms"]
    between = None if cost.between_us is None else cost.between_us / 1e3
    row = {"run": run, "unprofiled_median_ms": u, "model_mean_ms": mean, "model_median_ms": median,
           "mean_pct": 100 * (mean / u - 1), "median_pct": 100 * (median / u - 1), "between_steps_ms": between,
           "cost_share_pct": 100 * cost.share, "cost_text": cost.describe()}
    if between is not None:  # the correction scales the host's gaps too: the between-step time it left in the mean
        row["mean_less_between_pct"] = 100 * ((mean - between * (1 - cost.share)) / u - 1)
    events = np.count_nonzero((g.rank >= 0) & (g.step >= 0)) / max(len(g.meta.steps), 1) / max(len(loop.profiled), 1)
    row["events_per_step_rank"] = float(events)
    if cost.profiled_us is not None and cost.unprofiled_us is not None:
        row["wall_us_per_event"] = (cost.profiled_us - cost.unprofiled_us) / events
    first, window = steady_from(loop), set(g.meta.steps)
    cpu_in, cpu_out = job_sched(loop, window, first, "process_cpu_us"), job_sched(loop, None, first, "process_cpu_us")
    if cpu_in and cpu_out:
        row["process_cpu_us_per_event"] = (statistics.median(cpu_in) - statistics.median(cpu_out)) / len(loop.profiled) / events
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for run in args.runs:
        try:
            rows.append(split(run))
        except DagprofError as e:
            rows.append({"run": run, "error": str(e)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        if "error" in r:
            print(f"{r['run']}: {r['error']}")
            continue
        between = "-" if r["between_steps_ms"] is None else f"{r['between_steps_ms']:.1f} ms"
        rest = f", less it {r['mean_less_between_pct']:+.1f} %" if "mean_less_between_pct" in r else ""
        print(f"{r['run']}: unprofiled {r['unprofiled_median_ms']:.1f} ms; model mean {r['mean_pct']:+.1f} %{rest}, median "
              f"{r['median_pct']:+.1f} %; between steps {between}; cost removed {r['cost_share_pct']:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
