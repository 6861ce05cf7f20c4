"""Measured runs for the ZeRO-1 script's what-ifs (``zero1_adam.py``): per round, on the namespace testbed's shaped
loopback (``bench/shaped_loopback.py``; root), a 2-rank job profiled at the faster rate and unprofiled jobs at each rate;
on the host (no shaping), an unprofiled 2-rank job, one with ``--workers`` ranks and one per ``--bucket-cap-mb`` value.
Each unprofiled job's figure is the median of its own steps from step 5 on (the script prints it); the load beside it.
Predictions are made afterwards from the kept profiles (``dagprof whatif``), so one set of runs judges two checkouts.
``--script`` measures another fresh script that prints its median step the same way (``clip_contrastive.py``);
``--plain-profiler FLAG``: the script profiles itself with plain ``torch.profiler`` into the folder given after ``FLAG``
(``plain_mlp.py --trace-dir``), as a user's job does, in place of ``dagprof profile``.

    flock /tmp/dagprof-measure.lock python bench/ddp_fresh/zero1_measure.py --keep /tmp/zero1/tb --rates 1000,200 \\
        --before BEFORE
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")
sys.path.insert(0, os.path.dirname(HERE))

from shaped_loopback import namespace, shape_loopback  # noqa: E402

SCRIPT = os.path.join(HERE, "zero1_adam.py")
MEDIAN = re.compile(r"median step ([0-9.]+) ms")


def job(prefix: list[str], ranks: int, args: list[str], profile_to: str | None = None, src: str = SRC, script: str = SCRIPT,
        plain: str = "") -> dict:
    """One torchrun job (profiled with the collector in ``src``, or by the script's own profiler into the folder after its
    option ``plain``); its median step (ms) as the script measured it, and the 1-minute load before it."""
    load = os.getloadavg()[0]
    cmd = ["torchrun", "--standalone", "--nproc-per-node", str(ranks), script, *args]
    if profile_to and plain:
        cmd += [plain, profile_to]
    elif profile_to:
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
    ap.add_argument("--script", default=SCRIPT, help="the fresh script to measure (it prints 'median step X ms')")
    ap.add_argument("--script-args", default="", help="its own arguments beside --steps, as one string")
    ap.add_argument("--plain-profiler", default="", metavar="FLAG",
                    help="the script's own option that makes it write torch.profiler traces into the folder after it")
    a = ap.parse_args()
    run = functools.partial(job, script=a.script, plain=a.plain_profiler)
    os.makedirs(a.keep, exist_ok=True)
    rates = [float(r) * 1e6 for r in a.rates.split(",")]
    base = ["--steps", str(a.steps), *a.script_args.split()]
    out: list[dict] = []
    for k in range(a.rounds):
        first = len(out)
        if "testbed" not in a.skip:
            with namespace("z1", a.keep) as (ns, _):
                prefix = ["ip", "netns", "exec", ns]
                shape_loopback(ns, rates[0])
                out.append(run(prefix, 2, base, os.path.join(a.keep, f"prof-{rates[0] / 1e6:g}-{k}")) | {"rate": rates[0]})
                if a.before:
                    out.append(run(prefix, 2, base, os.path.join(a.keep, f"prof-before-{rates[0] / 1e6:g}-{k}"),
                                   os.path.join(a.before, "src")) | {"rate": rates[0]})
                for rate in rates:
                    shape_loopback(ns, rate)
                    out.append(run(prefix, 2, base) | {"rate": rate})
        if "host" not in a.skip:
            out.append(run([], 2, base, os.path.join(a.keep, f"prof-host-{k}")) | {"rate": None})
            if a.before:
                out.append(run([], 2, base, os.path.join(a.keep, f"prof-before-host-{k}"), os.path.join(a.before, "src")) | {"rate": None})
            out.append(run([], 2, base) | {"rate": None})
            out.append(run([], a.workers, base) | {"rate": None})
            for cap in a.bucket_cap_mb.split(","):
                out.append(run([], 2, [*base, "--bucket-cap-mb", cap]) | {"rate": None})
        for row in out[first:]:
            row["round"] = k  # its own round's profile predicts it (zero1_predict.py)
            print(json.dumps(row))
    with open(os.path.join(a.keep, "measured.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
