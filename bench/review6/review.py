"""Run the review6 fresh scripts (bench/review6) through dagprof as a user would, and measure one what-if each.

Each script is profiled twice with the zero-code command (``dagprof profile -- torchrun --standalone
--nproc-per-node N SCRIPT``, each under the machine-wide measurement lock), then goes through replay (and
``--template``), analyze, report, the what-ifs of its kind, optimize and diff, each also with ``--json``; a line per
command says ok, "refused: <the one line>" (exit 2) or FAILED (bench/fsdp_fresh/chain.py ``check``). ``--measure``
then runs the job unprofiled at one what-if's setting (the script's own flag, under the lock) and prints the
what-if's prediction from the first profile beside that run's median step; ``--verify`` adds ``optimize --verify``.

    python bench/review6/review.py --keep /tmp/review6 --measure            # every script (about 15 minutes on 2 cores)
    python bench/review6/review.py --scripts hsdp_moe --keep /tmp/review6 --offline   # the kept runs, not profiled again
    flock /tmp/dagprof-measure.lock python bench/review6/review.py --no-lock --measure-only --keep DIR   # one lock for all
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "src")))
_spec = importlib.util.spec_from_file_location("fsdp_chain", os.path.join(HERE, "..", "fsdp_fresh", "chain.py"))
chain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chain)

from dagprof.collect.hooks.steptimes import read_times  # noqa: E402
from dagprof.collect.jobs.launch import Bootstrap, launch  # noqa: E402

LOCK = ["flock", "/tmp/dagprof-measure.lock"]  # ``--no-lock``: [] (crashes and refusals only: no figure is kept)
FSDP_WHATIFS = (["--bandwidth", "200Mbit"], ["--workers", "4"], ["--reshard-after-forward", "on,off"], ["--prefetch", "2"],
                ["--data-parallel", "ddp"], ["--units", "merge:all"])
# script -> (ranks, what-ifs, (what-if measured, the script's flags for that setting))
SCRIPTS = {
    "convnext_accum": (2, FSDP_WHATIFS, (["--reshard-after-forward", "off"], ["--keep-gathered"])),
    "hsdp_moe": (4, (*FSDP_WHATIFS, ["--mesh", "1x4"]), (["--mesh", "1x4"], ["--replicate", "1"])),
    "lstm_join": (2, (["--bandwidth", "200Mbit"], ["--workers", "4"], ["--bucket-mb", "25"], ["--data-parallel", "fsdp"]),
                  (["--bucket-mb", "25"], ["--bucket-mb", "25"])),
}


def torchrun(script: str, steps: int, extra: list[str] = ()) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(SCRIPTS[script][0]),
            os.path.join(HERE, f"{script}.py"), "--steps", str(steps), *extra]


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def profile(script: str, run: str, steps: int) -> bool:
    done = subprocess.run([*LOCK, sys.executable, "-m", "dagprof.cli.main", "profile", "-o", run, "--",
                           *torchrun(script, steps)], capture_output=True, text=True)
    if done.returncode:
        last = done.stderr.strip().splitlines()[-1:] or [""]
        print(f"{'refused ' if done.returncode == 2 else 'FAILED  '} profile {script}: {last[0][:300]}")
        return False
    print(f"ok       profile {run} (load {load()})")
    return True


def step_ms(folder: str) -> float:
    """Median optimizer step of the slowest rank after the first third of the steps."""
    per_rank = read_times(folder)
    n = min(len(t["step_s"]) for t in per_rank)
    return 1e3 * statistics.median(max(t["step_s"][i] for t in per_rank) for i in range(n // 3, n))


def measure(script: str, run: str, steps: int, root: str) -> None:
    whatif, flags = SCRIPTS[script][2]
    done = chain.dagprof("whatif", run, *whatif, "--allow-model-error", "--no-trace", "--json")
    if done.returncode:
        print(f"FAILED   measure {script}: whatif {' '.join(whatif)}: {done.stderr.strip()[-300:]}")
        return
    out = json.loads(done.stdout)
    row = out["scenarios"][-1]
    times = os.path.join(root, f"{script}-measured")
    cmd = [*LOCK, *torchrun(script, steps, flags)]
    before = load()
    launch(cmd, Bootstrap(times=times), log_dir=times)
    got = step_ms(times)
    pred = row["predicted_iter_ms"]
    print(f"measure  {script} whatif {' '.join(whatif)}: predicted {pred:.1f} ms ({row.get('lo_ms')}-{row.get('hi_ms')}), "
          f"measured {got:.1f} ms: {100 * (pred / got - 1):+.1f} % (model error {out.get('model_error_pct')} %, "
          f"load {before} -> {load()})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scripts", default=",".join(SCRIPTS))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--keep", help="folder for the runs (default: a temporary one)")
    p.add_argument("--offline", action="store_true", help="review the runs kept in --keep without profiling again")
    p.add_argument("--measure", action="store_true", help="run each job at one what-if's setting and compare")
    p.add_argument("--measure-only", action="store_true",
                   help="profile once and measure, nothing else: run the whole under one lock with --no-lock, then review --offline")
    p.add_argument("--verify", action="store_true", help="also optimize --verify (two interleaved rounds, under the lock)")
    p.add_argument("--no-lock", action="store_true", help="profile without the measurement lock (no figure to report)")
    args = p.parse_args()
    if args.no_lock:
        LOCK.clear()
    root = args.keep or tempfile.mkdtemp(prefix="review6_")
    for script in args.scripts.split(","):
        a, b = (os.path.join(root, f"{script}-{x}") for x in "ab")
        if args.measure_only:
            if profile(script, a, args.steps):
                measure(script, a, args.steps, root)
            continue
        if not args.offline and not (profile(script, a, args.steps) and profile(script, b, args.steps)):
            continue
        print(f"== {script}")
        chain.check(f"{script} replay", ["replay", a])
        chain.check(f"{script} replay --template", ["replay", a, "--template"])
        chain.check(f"{script} analyze", ["analyze", a])
        chain.check(f"{script} report", ["report", a])
        for w in SCRIPTS[script][1]:
            chain.check(f"{script} whatif {' '.join(w)}", ["whatif", a, *w])
            chain.check(f"{script} whatif {' '.join(w)} --allow-model-error", ["whatif", a, *w, "--allow-model-error"])
        chain.check(f"{script} optimize", ["optimize", a, "--budget", "10"])
        chain.check(f"{script} diff", ["diff", a, b])
        if args.measure:
            measure(script, a, args.steps, root)
        if args.verify:
            chain.check(f"{script} optimize --verify", ["optimize", a, "--budget", "10", "--rounds", "2", "--verify", "--",
                                                         *LOCK, *torchrun(script, args.steps)])
    print(f"runs kept in {root}")


if __name__ == "__main__":
    main()
