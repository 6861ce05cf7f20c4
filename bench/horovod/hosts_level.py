"""Does a Horovod job on the two-host testbed hold one level from job to job? The same job (a ``bench/frameworks`` script,
its window profiled, at one rate: as ``bench_frameworks.py --testbed --hosts`` runs its measured job) run again and again,
alternately with every host's processes free on all of this machine's cores (``--shared-cores``, the testbed before
2026-12-06) and each host's confined to a core of its own (``bench_frameworks.host_cores``); per job its median step, the
median of its unprofiled steps and its collectives per step, and per setting their median and spread ((max - min) /
median). A what-if cannot be judged on rounds whose jobs move more from one to the next than the wire moves them.

    sudo env PYTHONPATH=src DAGPROF_HOROVOD_VENV=/opt/hvd python bench/horovod/hosts_level.py --only hvd_autoencoder,hvd_text \\
        --jobs 4 --rate 200e6 --keep DIR [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_frameworks import python_for, run_job  # noqa: E402
from shaped_loopback import hosts_namespaces, measured  # noqa: E402

from dagprof.errors import DagprofError  # noqa: E402

SETTINGS = ("shared", "own")  # every host on all cores / each host on a core of its own
KEYS = ("measured_median_ms", "unprofiled_median_ms", "comm_ms")


def one_job(name: str, python: str, out: str, cluster, rate: float, setting: str, args) -> dict:
    """One job, ``bench_frameworks.run_job`` as the testbed runs it, in the given setting; its ``measured`` figures."""
    job_args = argparse.Namespace(workers=args.workers, timeout=args.timeout, script_args="", shared_cores=setting == "shared")
    got = run_job(name, python, out, cluster, rate, job_args, rate)
    if "refused" not in got:
        try:
            got |= measured(out)
        except DagprofError as e:
            got["refused"] = str(e)
    print(f"{name} {setting}: {got}", file=sys.stderr, flush=True)
    return got


def spread(jobs: list[dict]) -> dict:
    """Per figure: the jobs' median, min, max and (max - min) / median, %."""
    out = {}
    for key in KEYS:
        vals = [j[key] for j in jobs if j.get(key) is not None]
        if vals:
            med = float(np.median(vals))
            out[key] = {"median": med, "min": min(vals), "max": max(vals), "spread_pct": 100.0 * (max(vals) - min(vals)) / med}
    out["load"] = [round(j["load"], 2) for j in jobs]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="hvd_autoencoder,hvd_text")
    ap.add_argument("--jobs", type=int, default=4, help="jobs per setting and script, alternating")
    ap.add_argument("--rate", type=float, default=200e6, help="the link rate, bit/s")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--keep", help="keep the run folders here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = {}
    with hosts_namespaces("hlv", args.keep, args.workers) as (cluster, keep):
        for name in args.only.split(","):
            python = python_for(name)
            if not python:
                continue
            one_job(name, python, os.path.join(keep, f"{name}-settle"), cluster, args.rate, "shared", args)  # no script's first job judged
            jobs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
            for i in range(args.jobs):
                for setting in SETTINGS if i % 2 == 0 else SETTINGS[::-1]:
                    jobs[setting].append(one_job(name, python, os.path.join(keep, f"{name}-{setting}-{i}"), cluster, args.rate, setting, args))
            results[name] = {s: {"jobs": jobs[s], "summary": spread(jobs[s])} for s in SETTINGS}
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for name, r in results.items():
            for s in SETTINGS:
                print(f"{name} {s}: {json.dumps(r[s]['summary'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
