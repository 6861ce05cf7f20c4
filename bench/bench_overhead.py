"""Overhead of dagprof collection on a real 2-rank gloo DDP job (the demo CNN), against no profiler and torch.profiler.

Each mode is a fresh spawned 2-rank job; the figure per job is the median step time of
rank 0 over the profiled window (forward + backward + optimizer; the one-off window
start/stop work is excluded); the figure per mode is the median over repeated jobs,
interleaved so that background load hits every mode alike. This machine has 2 cores
shared with other work: expect a few % of noise and read the spread column.

    /tmp/venv0/bin/python bench/bench_overhead.py [--repeats 3] [--steps 22] [--small]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from dagprof.collect.demo_train import DemoConfig, spawn_demo

MODES = {  # name -> DemoConfig overrides
    "no profiler": dict(profile_steps=None),
    "dagprof hooks only (kineto=False)": dict(kineto=False),
    "dagprof (hooks + Kineto)": dict(),
    "torch.profiler alone (peer)": dict(profiler="torch"),
    "torch.profiler record_shapes=True (peer)": dict(profiler="torch", record_shapes=True),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=22)
    p.add_argument("--small", action="store_true", help="the tiny test model (fast smoke run)")
    args = p.parse_args()
    window = (6, args.steps - 2)
    base = DemoConfig.small() if args.small else DemoConfig()
    results: dict[str, list[float]] = {m: [] for m in MODES}
    t_start = time.perf_counter()
    for rep in range(args.repeats):
        for mode, overrides in MODES.items():
            cfg = DemoConfig(**{**base.__dict__, "steps": args.steps, "profile_steps": window, **overrides})
            with tempfile.TemporaryDirectory(prefix="dagprof-bench-") as out:
                times = spawn_demo(cfg, out)[0]
            results[mode].append(statistics.median(times[window[0]:window[1]]) * 1e3)
            print(f"  run {rep + 1}/{args.repeats} {mode}: {results[mode][-1]:.1f} ms/step", flush=True)
    off = statistics.median(results["no profiler"])
    print(f"\n2-rank gloo DDP demo CNN ({'small' if args.small else 'default'} model, batch {base.batch_size}, "
          f"bucket_cap_mb {base.bucket_cap_mb}), steps {window[0]}-{window[1] - 1}, {args.repeats} jobs per mode, "
          f"{time.perf_counter() - t_start:.0f} s total")
    print(f"{'mode':44s} {'median ms/step':>15s} {'vs none':>8s} {'spread (min-max)':>18s}")
    for mode, runs in results.items():
        med = statistics.median(runs)
        print(f"{mode:44s} {med:15.1f} {med / off:8.3f} {min(runs):8.1f}-{max(runs):.1f}")


if __name__ == "__main__":
    main()
