"""A load spike inside the profiled window against the profiler's own cost (issue 20 item 2): what dagprof measures and predicts.

Each round profiles the demo job (2-rank gloo DDP, ``run_demo_training``) twice, in turn: quiet, and with a CPU hog
(one busy-looping process pinned to each core, ``taskset``) started when rank 0's window opens (its step files appear)
and stopped when both ranks have logged their last profiled step. Per run: the profiler's cost as
``measure_profiler_cost`` reads it (the share removed from the op times, or why none), the what-if of the profiled
setup (``dagprof whatif RUN --json``: the point and its interval) against the job's unprofiled steps' median (the steps
before and after the window, past the warm-up: what the prediction is for), and the 1-minute load before the run.
Run it under the machine's lock (its timings are reported):

    flock /tmp/dagprof-measure.lock python bench/bench_profiler_spike.py --rounds 3 --out /tmp/spike/runs
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

from dagprof.cli.main import main as cli
from dagprof.collect.jobs.demo_train import DemoConfig, run_demo_training
from dagprof.passes.profiler_cost import job_steps, measure_profiler_cost, resumed_step, steady_from
from dagprof.pipeline import open_run
from dagprof.traces.run_schema import STEPS_LOG, rank_file, steps_dir

HOG = "while True: pass"


def steps_logged(out: str, rank: int) -> int:
    """The profiled steps a rank has completed: lines of its step log (``rank<R>.steps/steps.jsonl``; gone once its profile is written)."""
    try:
        with open(os.path.join(out, steps_dir(rank), STEPS_LOG), "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return -1 if os.path.exists(os.path.join(out, rank_file(rank))) else 0


def hog_during_window(out: str, world: int, window: int, per_core: int, stop: threading.Event, spans: list[float]) -> None:
    """Start ``per_core`` busy loops on each core when rank 0's window opens; stop them when every rank has completed its profiled steps."""
    while not os.path.isdir(os.path.join(out, steps_dir(0))):
        if stop.wait(0.002):
            return
    procs = [subprocess.Popen(["taskset", "-c", str(c), sys.executable, "-c", HOG]) for c in range(os.cpu_count() or 1) for _ in range(per_core)]
    t0 = time.monotonic()
    while not all(steps_logged(out, r) in (-1, window) for r in range(world)) and not stop.wait(0.002):
        pass
    for p in procs:
        p.kill()
        p.wait()
    spans.append(time.monotonic() - t0)


def job_options(small: bool) -> dict:
    """The demo job's size: its default CNN (1 MiB buckets), or ``DemoConfig.small``'s tiny one (as tests/test_profiler_cost.py)."""
    if not small:
        return {"bucket_cap_mb": 1.0}
    tiny = DemoConfig.small()
    return {k: getattr(tiny, k) for k in ("width", "blocks", "image_size", "batch_size", "bucket_cap_mb")}


def one_run(out: str, hog: bool, args: argparse.Namespace) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    load = float(open("/proc/loadavg").read().split()[0])
    stop, spans = threading.Event(), []
    watcher = threading.Thread(target=hog_during_window, args=(out, 2, args.stop - args.first, args.hogs, stop, spans), daemon=True) if hog else None
    if watcher:
        watcher.start()
    try:
        run_demo_training(out, world_size=2, steps=args.steps, profile_steps=(args.first, args.stop), **job_options(args.small))
    finally:
        stop.set()
        if watcher:
            watcher.join()
    return {"hog": hog, "load1": load, "hog_s": spans[0] if spans else None} | analyse(out)


def analyse(out: str) -> dict:
    """The profiler's cost and the what-if of the profiled setup on run ``out``, against its unprofiled steps' median."""
    g = open_run(out).graph
    cost = measure_profiler_cost(g)
    loop = g.meta.loop_steps
    unprofiled = job_steps(loop.unprofiled, None, g.meta.job_of, steady_from(loop), resumed_step(loop))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli(["whatif", out, "--no-trace", "--allow-model-error", "--json"])
    row = json.loads(buf.getvalue())["scenarios"][0]
    measured = statistics.median(unprofiled) / 1e3
    return {"run": out, "profiled_ms": cost.profiled_us / 1e3, "unprofiled_ms": measured, "corrected_pct": -100 * cost.share,
            "verdict": cost.verdict, "text": cost.describe(),
            "predicted_ms": row["predicted_iter_ms"], "lo_ms": row["lo_ms"], "hi_ms": row["hi_ms"],
            "error_pct": 100 * (row["predicted_iter_ms"] - measured) / measured,
            "inside": row["lo_ms"] <= measured <= row["hi_ms"], "terms": row["interval_basis"]["terms"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--first", type=int, default=8, help="first profiled step (default 8)")
    p.add_argument("--stop", type=int, default=16, help="first step after the window (default 16)")
    p.add_argument("--hogs", type=int, default=1, help="busy loops per core during the window (default 1)")
    p.add_argument("--small", action="store_true", help="the tiny model of the tests (a few ms a step)")
    p.add_argument("--out", default="/tmp/spike/runs", help="kept run folders and results.jsonl")
    p.add_argument("--reanalyse", action="store_true", help="no new runs: the kept ones of --out, read by the dagprof on the path "
                   "(another checkout's: PYTHONPATH=OTHER/src), one JSON line each")
    args = p.parse_args()
    if args.reanalyse:
        for line in open(os.path.join(args.out, "results.jsonl")):
            kept = json.loads(line)
            print(json.dumps({k: kept[k] for k in ("hog", "load1")} | analyse(kept["run"])), flush=True)
        return
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.jsonl"), "a") as log:
        for i in range(args.rounds):
            for hog in (i % 2 == 1, i % 2 == 0):  # interleaved, the order alternating by round
                r = one_run(os.path.join(args.out, f"r{i}-{'hog' if hog else 'quiet'}"), hog, args)
                log.write(json.dumps(r) + "\n")
                log.flush()
                print(f"{'hog  ' if hog else 'quiet'} load {r['load1']:.2f}  corrected {r['corrected_pct']:+.1f} %  predicted "
                      f"{r['predicted_ms']:.1f} ms ({r['lo_ms']:.1f}-{r['hi_ms']:.1f}) vs unprofiled {r['unprofiled_ms']:.1f} ms: "
                      f"{r['error_pct']:+.1f} %{'' if r['inside'] else ' OUTSIDE'} | {r['text']}", flush=True)


if __name__ == "__main__":
    main()
