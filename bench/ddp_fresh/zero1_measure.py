"""Measured runs for the ZeRO-1 script's what-ifs (``zero1_adam.py``): per round, on the namespace testbed's shaped
loopback (``bench/shaped_loopback.py``; root), a 2-rank job profiled at the faster rate and unprofiled jobs at each rate;
on the host (no shaping), an unprofiled 2-rank job, one with ``--workers`` ranks and one per ``--bucket-cap-mb`` value.
Each unprofiled job's figure is the median of its own steps from step 5 on (the script prints it); the load beside it.
Predictions are made afterwards from the kept profiles (``dagprof whatif``), so one set of runs judges two checkouts.

    flock /tmp/dagprof-measure.lock python bench/ddp_fresh/zero1_measure.py --keep /tmp/zero1/tb --rates 1000,200 \\
        --before /work/main
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from functools import partial

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")
sys.path.insert(0, os.path.dirname(HERE))

from shaped_loopback import namespace, shape_loopback  # noqa: E402

SCRIPT = os.path.join(HERE, "zero1_adam.py")  # --script: another that prints "median step X ms" (zero1_overlap.py)
MEDIAN = re.compile(r"median step ([0-9.]+) ms")


def job(prefix: list[str], ranks: int, args: list[str], profile_to: str | None = None, src: str = SRC, script: str = SCRIPT) -> dict:
    """One torchrun job (profiled with the collector in ``src``); its median step (ms) as the script measured it, and the
    1-minute load before it."""
    load = os.getloadavg()[0]
    cmd = ["torchrun", "--standalone", "--nproc-per-node", str(ranks), script, *args]
    if profile_to:
        cmd = [sys.executable, "-m", "dagprof.cli.main", "profile", "-o", profile_to, "--", *cmd]
    env = dict(os.environ, PYTHONPATH=src)
    r = subprocess.run([*prefix, *cmd], env=env, capture_output=True, text=True, timeout=900)
    m = MEDIAN.search(r.stdout + r.stderr)
    return {"ranks": ranks, "args": args, "load": load, "exit": r.returncode,
            "median_ms": float(m.group(1)) if m else None, "profiled": profile_to}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", required=True)
    ap.add_argument("--rates", default="1000,200", help="Mbit/s, the first profiled")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--bucket-cap-mb", default="1")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--skip", default="", help="comma list of testbed,host to leave out")
    ap.add_argument("--before", default="", help="a checkout (holding src/) whose collector profiles too: prof-before-*")
    ap.add_argument("--script", default=SCRIPT, help="the training script (its --steps, and --bucket-cap-mb on the host)")
    a = ap.parse_args()
    job_of = partial(job, script=os.path.abspath(a.script))
    os.makedirs(a.keep, exist_ok=True)
    rates = [float(r) * 1e6 for r in a.rates.split(",")]
    base = ["--steps", str(a.steps)]
    out: list[dict] = []
    for k in range(a.rounds):
        if "testbed" not in a.skip:
            with namespace("z1", a.keep) as (ns, _):
                prefix = ["ip", "netns", "exec", ns]
                shape_loopback(ns, rates[0])
                out.append(job_of(prefix, 2, base, os.path.join(a.keep, f"prof-{rates[0] / 1e6:g}-{k}")) | {"rate": rates[0]})
                if a.before:
                    out.append(job_of(prefix, 2, base, os.path.join(a.keep, f"prof-before-{rates[0] / 1e6:g}-{k}"),
                                   os.path.join(a.before, "src")) | {"rate": rates[0]})
                for rate in rates:
                    shape_loopback(ns, rate)
                    out.append(job_of(prefix, 2, base) | {"rate": rate})
        if "host" not in a.skip:
            out.append(job_of([], 2, base, os.path.join(a.keep, f"prof-host-{k}")) | {"rate": None})
            if a.before:
                out.append(job_of([], 2, base, os.path.join(a.keep, f"prof-before-host-{k}"), os.path.join(a.before, "src")) | {"rate": None})
            out.append(job_of([], 2, base) | {"rate": None})
            out.append(job_of([], a.workers, base) | {"rate": None})
            for cap in a.bucket_cap_mb.split(","):
                out.append(job_of([], 2, [*base, "--bucket-cap-mb", cap]) | {"rate": None})
        for row in out:
            print(json.dumps(row))
    with open(os.path.join(a.keep, "measured.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
