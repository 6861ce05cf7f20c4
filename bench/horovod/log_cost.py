"""What Horovod's trace log (``traces.horovod_log``: every rank's own response ends) costs a user's steps.

Horovod reads ``HOROVOD_LOG_LEVEL`` once, at its first message, so the level ``dagprof profile`` sets holds for the whole
job, not the profiled window alone. Jobs of a ``bench/frameworks`` Horovod script, profiled as ``bench_frameworks.py``
profiles them, alternate between the log (dagprof sets the level) and none (the job's own ``HOROVOD_LOG_LEVEL=warning``,
which dagprof leaves alone); per job its median profiled step and the median of its unprofiled steps (the slowest
rank's, past the warm-up: ``shaped_loopback.measured``). Run it with nothing else on the cores:

    DAGPROF_HOROVOD_VENV=VENV python bench/horovod/log_cost.py --only hvd_sparse_gru --pairs 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench_frameworks import launch, python_for  # noqa: E402
from shaped_loopback import measured  # noqa: E402


def job(name: str, out: str, log: bool, timeout: float) -> dict:
    """One profiled job, with Horovod's trace log or without; its step medians, ms."""
    os.makedirs(out, exist_ok=True)
    os.environ.pop("HOROVOD_LOG_LEVEL", None)
    if not log:
        os.environ["HOROVOD_LOG_LEVEL"] = "warning"  # the job's own level: dagprof keeps no log
    try:
        codes = launch(name, python_for(name), out, 2, timeout)
    finally:
        os.environ.pop("HOROVOD_LOG_LEVEL", None)
    got = measured(out) if not any(codes) else {}
    return {"log": log, "exit": codes, "load": os.getloadavg()[0], "logged": os.path.exists(os.path.join(out, "rank0.horovod.log")),
            "profiled_ms": got.get("measured_median_ms"), "unprofiled_ms": got.get("unprofiled_median_ms")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="hvd_sparse_gru")
    ap.add_argument("--pairs", type=int, default=3, help="jobs with the log and without, alternating (ABBA...)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--keep", help="keep the run folders here")
    args = ap.parse_args(argv)
    keep = args.keep or tempfile.mkdtemp(prefix="dagprof-logcost-")
    rows = []
    for k in range(2 * args.pairs):
        log = (k % 4) in (0, 3)  # with, without, without, with, ...
        out = os.path.join(keep, f"{args.only}-{k}-{'log' if log else 'nolog'}")
        rows.append(job(args.only, out, log, args.timeout) | {"job": k})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    summary = {}
    for log in (True, False):
        mine = [r for r in rows if r["log"] == log and r["profiled_ms"] is not None]
        summary["log" if log else "nolog"] = {key: statistics.median(r[key] for r in mine) if mine and all(r[key] for r in mine) else None
                                              for key in ("profiled_ms", "unprofiled_ms")}
    print(json.dumps({"jobs": rows, "median": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
