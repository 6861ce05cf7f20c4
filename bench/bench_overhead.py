"""Overhead of dagprof collection on a real 2-rank gloo DDP job (the demo CNN), against no profiler and torch.profiler.

Each mode is a fresh spawned 2-rank job; the figures per job are medians over the profiled
window of rank 0's step time (wall: forward + backward + optimizer; the one-off window
start/stop work is excluded) and of its main thread's CPU time per step (cpu: what profiling
adds on the training thread, unaffected by other processes competing for the cores). The
figure per mode is the median over repeated jobs, interleaved so that background load hits
every mode alike. This machine has 2 cores shared with other work: wall times are noisy,
read the spread column; the cpu ratio is the stable overhead figure.

    /tmp/venv0/bin/python bench/bench_overhead.py [--repeats 3] [--steps 22] [--small]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from dagprof.collect.demo_train import DemoConfig, spawn_demo_clocks

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
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    t_start = time.perf_counter()
    for rep in range(args.repeats):
        for mode, overrides in MODES.items():
            cfg = DemoConfig(**{**base.__dict__, "steps": args.steps, "profile_steps": window, **overrides})
            with tempfile.TemporaryDirectory(prefix="dagprof-bench-") as out:
                clocks = spawn_demo_clocks(cfg, out)
            results[mode].append(statistics.median(clocks["wall"][0][window[0]:window[1]]) * 1e3)
            cpu[mode].append(statistics.median(clocks["cpu"][0][window[0]:window[1]]) * 1e3)
            print(f"  run {rep + 1}/{args.repeats} {mode}: {results[mode][-1]:.1f} ms/step wall, {cpu[mode][-1]:.1f} ms cpu",
                  flush=True)
    off, off_cpu = statistics.median(results["no profiler"]), statistics.median(cpu["no profiler"])
    print(f"\n2-rank gloo DDP demo CNN ({'small' if args.small else 'default'} model, batch {base.batch_size}, "
          f"bucket_cap_mb {base.bucket_cap_mb}), steps {window[0]}-{window[1] - 1}, {args.repeats} jobs per mode, "
          f"{time.perf_counter() - t_start:.0f} s total")
    print(f"{'mode':42s} {'wall ms/step':>12s} {'vs none':>8s} {'spread':>14s} {'cpu ms/step':>12s} {'vs none':>8s}")
    for mode, runs in results.items():
        med, c = statistics.median(runs), statistics.median(cpu[mode])
        print(f"{mode:42s} {med:12.1f} {med / off:8.3f} {min(runs):6.1f}-{max(runs):<7.1f} {c:12.1f} {c / off_cpu:8.3f}")


if __name__ == "__main__":
    main()
