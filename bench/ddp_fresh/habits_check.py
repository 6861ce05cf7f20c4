"""``habits_loop.py``'s what-ifs against measured runs of the same script on the namespace testbed (run as root).

Per round: the script profiled at 1 Gbit/s (steps 3-10: a checkpoint step and an evaluation step inside), and measured
unprofiled with each changed setting: 1 Gbit/s, 200 Mbit/s, ``--bucket-mb 1``, 4 ranks (one host's 2 cores, as the
profile's 2 ranks shared them); a profile of ``--no-habits`` is kept for ``dagprof diff``. Each what-if is predicted from
the round's profile (``whatif --json``, ``--profiled-bandwidth 1Gbit``). The figure compared is dagprof's: the mean over
the window's steps (3-10) of the slowest rank's step, the checkpoint and evaluation steps in it as in the profile.

    flock /tmp/dagprof-measure.lock .venv/bin/python bench/ddp_fresh/habits_check.py --keep /tmp/habits/check
    .venv/bin/python bench/ddp_fresh/habits_check.py --repredict /tmp/habits/check   # no job, no root
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", "..", "src"))
sys.path.insert(0, SRC)

from dagprof.collect.hooks.steptimes import read_times  # noqa: E402
from dagprof.collect.jobs.launch import Bootstrap, launch  # noqa: E402
from dagprof.collect.jobs.netns import Cluster  # noqa: E402

WINDOW = range(3, 11)
ARGS = ["--steps", "16"]
# cell -> (ranks, link bit/s, script arguments, whatif flags predicting it)
CELLS = {
    "1Gbit": (2, 1e9, [], ["--bandwidth", "1Gbit"]),
    "200Mbit": (2, 200e6, [], ["--bandwidth", "200Mbit"]),
    "bucket1": (2, 1e9, ["--bucket-mb", "1"], ["--bandwidth", "1Gbit", "--bucket-mb", "1"]),
    "workers4": (4, 1e9, [], ["--bandwidth", "1Gbit", "--workers", "4", "--cores", "2"]),
}


def window_ms(folder: str) -> tuple[float, float]:
    """(mean, median) over the window's steps of the slowest rank's step time, ms: the mean is dagprof's iteration, the
    median what its interval is for."""
    per_rank = read_times(folder)
    steps = [1e3 * max(t["step_s"][s] for t in per_rank) for s in WINDOW]
    return statistics.fmean(steps), statistics.median(steps)


def predict(run: str, flags: list[str]) -> tuple[float, float, float]:
    """(predicted mean iteration, the 90 % interval's low and high ends for the median step), ms."""
    done = subprocess.run([sys.executable, "-m", "dagprof.cli.main", "whatif", run, *flags, "--profiled-bandwidth", "1Gbit",
                           "--allow-model-error", "--no-trace", "--json"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC})
    if done.returncode:
        return float("nan"), float("nan"), float("nan")
    row = json.loads(done.stdout)["scenarios"][0]
    return row["predicted_iter_ms"], row["lo_ms"], row["hi_ms"]


def run_rounds(root: str, rounds: range) -> None:
    script = os.path.join(HERE, "habits_loop.py")
    os.environ["PYTHONPATH"] = SRC
    with Cluster(4) as cluster:
        for k in rounds:
            jobs = [("profile", 2, 1e9, [], Bootstrap(profile=os.path.join(root, f"r{k}-profile"), steps=WINDOW)),
                    ("nohabits", 2, 1e9, ["--no-habits"], Bootstrap(profile=os.path.join(root, f"r{k}-nohabits"), steps=WINDOW))]
            jobs += [(c, n, rate, extra, Bootstrap(times=os.path.join(root, f"r{k}-{c}"))) for c, (n, rate, extra, _) in CELLS.items()]
            for name, n, rate, extra, boot in jobs:
                cluster.set_rate(rate)
                launch([sys.executable, script, *ARGS, *extra], boot, ranks=n, cluster=cluster, log_dir=os.path.join(root, f"r{k}-{name}-log"))
                print(f"round {k} {name}: load {os.getloadavg()[0]:.2f}", flush=True)


def show(root: str) -> None:
    print(f"{'round':>5} {'cell':<9} {'measured':>11} {'predicted':>11} {'error':>8}   {'median':>9} {'interval (90 %)':>17}")
    k = 0
    while os.path.isdir(os.path.join(root, f"r{k}-profile")):
        for cell, (_, _, _, flags) in CELLS.items():
            (m, med), (p, lo, hi) = window_ms(os.path.join(root, f"r{k}-{cell}")), predict(os.path.join(root, f"r{k}-profile"), flags)
            inside = "in" if lo <= med <= hi else "OUT"
            print(f"{k:>5} {cell:<9} {m:>8.1f} ms {p:>8.1f} ms {100 * (p / m - 1):>+7.1f}%   {med:>6.1f} ms {lo:>6.0f}-{hi:.0f} ms {inside}")
        k += 1
    print(f"runs kept in {root}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--first", type=int, default=0, help="number of the first round (more rounds beside kept ones)")
    p.add_argument("--keep", default="/tmp/habits/check")
    p.add_argument("--repredict", metavar="KEPT", help="run nothing: predict the kept rounds again")
    args = p.parse_args()
    if args.repredict:
        show(args.repredict)
        return
    os.makedirs(args.keep, exist_ok=True)
    run_rounds(args.keep, range(args.first, args.first + args.rounds))
    show(args.keep)


if __name__ == "__main__":
    main()
