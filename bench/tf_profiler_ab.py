"""What TensorFlow's profiler costs a step, and where: each script run as pairs of 2-worker jobs on this host's loopback,
one with dagprof's window as a user has it (the profiler on for its steps) and one with the same window dry
(``tf_dry_window/sitecustomize.py``: the profiler's start and stop no-ops; the step marks, the barrier at the window's end,
the forked stop and the per-step schedstat reads all still run), their order alternating by pair (A B, B A, ...).

A job's own steps outside the window are its reference: per job, the window's median step less the median of its steps
outside it (past ``WARMUP_STEPS``; and of those before it and after it apart: a job's pace moves), for the wall step
(the slowest rank's) and for the CPU the ranks' processes spent (all ranks together), in all and per thread name (TF
names its pools: ``tf_Compute`` runs the ops, ``collective_ops`` the collectives' executor; ``python`` the training
thread and the unnamed ones). The dry job's excess is what the window holds
beyond the profiler (a warm-up that runs into it, the epoch's end): the profiler's cost is the real job's excess less the
dry one's, per pair, and the job's wall seconds against the dry job's give what the profiler's start, stop and collection
add outside the steps.

    DAGPROF_TF_PYTHON=/opt/tf/bin/python python bench/tf_profiler_ab.py --only tf_mmoe_fit,tf_transformer_loop --pairs 3 [--keep DIR] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_frameworks import SCRIPTS, SRC, launch, python_for  # noqa: E402

sys.path.insert(0, SRC)
from dagprof.graph.meta import WARMUP_STEPS  # noqa: E402

DRY = os.path.join(HERE, "tf_dry_window")  # its sitecustomize makes the profiler's start and stop no-ops


def excess(out: str) -> dict[str, float]:
    """One job's window against its other steps (``WARMUP_STEPS`` on): per quantity the window's median less the median of
    the steps outside it (``KEY``), of those before it (``KEY@before``) and of those after it (``KEY@after``), ms a step;
    ``window_ms`` and ``outside_ms``: the wall step's medians themselves (the slowest rank's)."""
    ranks = []
    for name in sorted(os.listdir(out)):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(out, name)) as f:
                ranks.append(json.load(f))
    inside = set.intersection(*({int(s) for s in d["step_times_us"]} for d in ranks))
    wall = [{int(s): v / 1e3 for s, v in (d["step_times_us"] | d["unprofiled_step_times_us"]).items()} for d in ranks]
    outside = set.intersection(*({s for s in w if s >= WARMUP_STEPS} for w in wall)) - inside
    sides = {"": outside, "@before": {s for s in outside if s < min(inside)}, "@after": {s for s in outside if s > max(inside)}}
    series: dict[str, dict[int, float]] = {"step_ms": {s: max(w[s] for w in wall) for s in inside | outside}}
    for d in ranks:
        rows = [("process_cpu_ms", s, cpu) for s, cpu in d["process_cpu_ns"]]
        rows += [("training_thread_cpu_ms", s, cpu) for s, cpu, _wait in d["thread_sched_ns"]]
        rows += [(f"cpu_ms:{name.split('#')[0]}", s, cpu) for name, per in d["named_threads_ns"].items() for s, cpu, _w, _r in per]
        for key, s, cpu in rows:
            series.setdefault(key, {}).setdefault(s, 0.0)
            series[key][s] += cpu / 1e6
    got = {}
    for key, per in series.items():
        a = [per.get(s, 0.0) for s in sorted(inside)]
        for side, steps in sides.items():
            b = [per.get(s, 0.0) for s in sorted(steps)]
            if a and b:
                got[key + side] = statistics.median(a) - statistics.median(b)
    got["window_ms"] = statistics.median(series["step_ms"][s] for s in inside)
    got["outside_ms"] = statistics.median(series["step_ms"][s] for s in outside)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="tf_mmoe_fit,tf_transformer_loop")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=200)
    ap.add_argument("--keep", help="keep the run folders here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = {}
    for name in args.only.split(","):
        python = python_for(name)
        if not python or SCRIPTS[name][0] != "tensorflow":
            continue
        jobs = []
        for k in range(args.pairs):
            for mode in (("real", "dry") if k % 2 == 0 else ("dry", "real")):
                out = os.path.join(args.keep, f"{name}-{k}-{mode}") if args.keep else tempfile.mkdtemp(prefix=f"dagprof-ab-{name}-")
                os.makedirs(out, exist_ok=True)
                os.environ["DAGPROF_BENCH_DRY_WINDOW"] = "1" if mode == "dry" else "0"
                t0 = time.monotonic()
                codes = launch(name, python, out, 2, args.timeout, src=SRC if mode == "real" else SRC + os.pathsep + DRY)
                row = {"pair": k, "mode": mode, "exit": codes, "seconds": round(time.monotonic() - t0, 1), "load": os.getloadavg()[0]}
                if not any(codes):
                    row |= excess(out)
                jobs.append(row)
                print(f"{name} {json.dumps(row)}", file=sys.stderr, flush=True)
                if not args.keep:
                    shutil.rmtree(out, ignore_errors=True)
        os.environ.pop("DAGPROF_BENCH_DRY_WINDOW", None)
        results[name] = {"jobs": jobs, "cost": cost_by_pair(jobs)}
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for name, r in results.items():
            for key, stats in r["cost"].items():
                print(f"{name} {key}: median {stats['median']:+.2f} ms a step, pairs {', '.join(f'{v:+.2f}' for v in stats['pairs'])}")
    return 0


def cost_by_pair(jobs: list[dict]) -> dict[str, dict]:
    """Per quantity: the real job's window excess less the dry one's, per pair, and their median (ms a step)."""
    by_pair: dict[int, dict[str, dict]] = {}
    for j in jobs:
        if "step_ms" in j:
            by_pair.setdefault(j["pair"], {})[j["mode"]] = j
    pairs = [p for p in by_pair.values() if len(p) == 2]
    keys = sorted(set.intersection(*(set(p["real"]) & set(p["dry"]) for p in pairs))) if pairs else []
    out = {}
    for key in keys:
        if key in ("pair", "mode", "exit", "load"):
            continue
        vals = [p["real"][key] - p["dry"][key] for p in pairs]
        out[key] = {"median": statistics.median(vals), "pairs": vals}
    return out


if __name__ == "__main__":
    sys.exit(main())
