"""Horovod what-ifs against reality: profile one setting, predict others, then measure them all.

1. profiles ``train_hvd.py`` under horovodrun at the base setting (``--base``);
2. predicts the iteration time at every other setting with ``dagprof whatif``'s engine
   (``--fusion-mb`` / ``--cycle-ms``) from that one profile;
3. measures every setting, the base included, without any profiler, in interleaved rounds
   (A B C A B C ...), each run's figure the median step time after warm-up;
4. prints predicted against measured (median over rounds, with the spread) side by side.

    HVD_VENV=/opt/hvd python bench/horovod/bench_whatif.py --rounds 3 \\
        --base cycle=1,fusion=128 --predict cycle=20 --predict fusion=0

Settings are ``cycle=MS,fusion=MIB`` (either may be left out: Horovod's default). The machine
this runs on may be shared: the spread column says how much the rounds disagreed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "src"))

from dagprof.collect.hooks.horovod import DEFAULT_CYCLE_MS, DEFAULT_FUSION_BYTES  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search.scenario import Scenario  # noqa: E402
from dagprof.search.whatif import evaluate  # noqa: E402

DEFAULT_FUSION_MB = DEFAULT_FUSION_BYTES / 2**20


def parse_setting(text: str) -> dict[str, float]:
    out = {"cycle": DEFAULT_CYCLE_MS, "fusion": DEFAULT_FUSION_MB}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in out:
            raise SystemExit(f"setting {text!r}: use cycle=MS and/or fusion=MIB")
        out[key] = float(value)
    return out


def label(s: dict[str, float]) -> str:
    return f"cycle {s['cycle']:g} ms, fusion {s['fusion']:g} MiB"


def horovodrun(venv: str, setting: dict[str, float], args: list[str], extra_env: dict[str, str] | None = None) -> None:
    env = {**os.environ, "HOROVOD_CYCLE_TIME": f"{setting['cycle']:g}", "HOROVOD_FUSION_THRESHOLD": str(int(setting["fusion"] * 2**20)),
           "OMP_NUM_THREADS": "1", **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "src")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [os.path.join(venv, "bin", "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
           os.path.join(venv, "bin", "python"), os.path.join(HERE, "train_hvd.py"), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"horovodrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def measure(venv: str, setting: dict[str, float], steps: int, warmup: int, model: list[str]) -> float:
    with tempfile.TemporaryDirectory(prefix="dagprof-hvd-") as tmp:
        out = os.path.join(tmp, "times.json")
        horovodrun(venv, setting, ["--steps", str(steps), "--times", out, *model])
        with open(out) as f:
            times = json.load(f)["step_s"][warmup:]
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Horovod fusion/cycle what-ifs: predicted vs measured")
    p.add_argument("--venv", default=os.environ.get("HVD_VENV") or os.environ.get("DAGPROF_HOROVOD_VENV"),
                   help="venv with Horovod (build_horovod.sh); default $HVD_VENV or $DAGPROF_HOROVOD_VENV")
    p.add_argument("--base", default="cycle=1", help="the profiled setting, e.g. cycle=1,fusion=128")
    p.add_argument("--predict", action="append", default=None, help="a setting to predict and measure (repeatable)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="steps per measured run")
    p.add_argument("--warmup", type=int, default=8, help="steps left out of each measured run's median")
    p.add_argument("--profile-steps", default="6:14", help="steps profiled in the base run")
    p.add_argument("--model", default="", help="extra train_hvd.py options, e.g. '--width 32 --blocks 2,2,2'")
    p.add_argument("--run", default=None, help="keep the profiled run folder here")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not args.venv:
        p.error("no Horovod venv: pass --venv or set HVD_VENV (build one with bench/horovod/build_horovod.sh VENV)")
    base = parse_setting(args.base)
    others = [parse_setting(s) for s in (args.predict or ["cycle=20", "fusion=0"])]
    model = args.model.split()
    t0 = time.time()

    run = args.run or tempfile.mkdtemp(prefix="dagprof-hvd-run-")
    first, _, stop = args.profile_steps.partition(":")
    horovodrun(args.venv, base, ["--steps", str(int(stop) + 2), "--profile", args.profile_steps, "--out", run, *model],
               {"HOROVOD_TIMELINE": "DYNAMIC"})
    prof = open_run(run, steps=range(int(first) + 1, int(stop)))  # the window's first step carries the hooks' start-up
    scenarios = [Scenario(cycle_ms=s["cycle"], fusion_mb=s["fusion"]) for s in [base] + others]
    # measured against the real runs below, so predict even where the model misses the profiled run by > 2 % (dagprof whatif refuses then)
    pred = evaluate(prof.graph, scenarios, measured_us=prof.analysis.measured_us, tolerance_pct=None)["scenarios"]

    settings = [base] + others
    measured: list[list[float]] = [[] for _ in settings]
    for _ in range(args.rounds):
        for k, s in enumerate(settings):
            measured[k].append(measure(args.venv, s, args.steps, args.warmup, model))

    rows = []
    for k, s in enumerate(settings):
        m = statistics.median(measured[k])
        rows.append({"setting": label(s), "profiled": k == 0, "predicted_ms": pred[k].predicted_iter_ms, "measured_ms": m,
                     "measured_rounds_ms": measured[k], "error_pct": 100 * (pred[k].predicted_iter_ms - m) / m})
    base_m = rows[0]["measured_ms"]
    for r in rows:
        r["measured_vs_base"] = r["measured_ms"] / base_m
        r["predicted_vs_base"] = r["predicted_ms"] / rows[0]["predicted_ms"]
    result = {"run": run, "profiled_measured_iter_ms": prof.analysis.measured_us / 1e3, "replayed_iter_ms": prof.analysis.predicted_us / 1e3,
              "rows": rows, "rounds": args.rounds, "seconds": time.time() - t0, "load_avg": os.getloadavg()}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"profiled run {run}: measured {result['profiled_measured_iter_ms']:.1f} ms/iter, replayed {result['replayed_iter_ms']:.1f} ms")
    print(f"{'setting':34}{'predicted':>11}{'measured':>11}{'spread':>17}{'error':>9}{'pred/base':>11}{'meas/base':>11}")
    for r in rows:
        lo, hi = min(r["measured_rounds_ms"]), max(r["measured_rounds_ms"])
        tag = " (profiled)" if r["profiled"] else ""
        print(f"{r['setting'] + tag:34}{r['predicted_ms']:>9.1f}ms{r['measured_ms']:>9.1f}ms{f'{lo:.1f}..{hi:.1f}':>17}"
              f"{r['error_pct']:>+8.1f}%{r['predicted_vs_base']:>11.2f}{r['measured_vs_base']:>11.2f}")
    print(f"{args.rounds} interleaved rounds, {args.steps} steps per run (first {args.warmup} left out); "
          f"load average {result['load_avg'][0]:.1f} (machine shared); {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
