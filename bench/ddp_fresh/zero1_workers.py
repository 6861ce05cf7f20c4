"""``dagprof whatif --workers N`` on a ZeRO-1 profile against measured N-rank jobs, on the namespace testbed (root).

Each rank in its own network namespace, its egress port shaped to ``--rate`` (``collect.jobs.netns.Cluster``: a
switch with one port per rank, as the cost model's ring assumes; the shared loopback of ``zero1_measure.py`` is one
link for every rank, where a broadcast tree and a ring do not compare as they do on a switch). Per round: the 2-rank
job profiled (Kineto, which sees ZeRO's broadcasts), then unprofiled 2-, 3- and 4-rank jobs (their order alternating
by round); each figure the script's median step from step 5 on, the 1-minute load before the job beside it. Predictions
come afterwards from the kept profiles, so one set of runs judges two checkouts:

    flock /tmp/dagprof-measure.lock python bench/ddp_fresh/zero1_workers.py --keep /tmp/zero4/tb --rounds 2
    python bench/ddp_fresh/zero1_workers.py --keep /tmp/zero4/tb --predict [--before BEFORE]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "zero1_adam.py")
MEDIAN = re.compile(r"median step ([0-9.]+) ms")


def job(c, ranks: int, steps: int, folder: str, profile: bool, script: str = SCRIPT) -> dict:
    """One job of ``script`` on the first ``ranks`` namespaces of ``c``: its median step (ms) as rank 0 printed it."""
    from dagprof.collect.jobs.launch import Bootstrap, launch

    load = os.getloadavg()[0]
    logs = os.path.join(folder, "logs")
    boot = Bootstrap(profile=folder, steps=range(5, 10)) if profile else None
    launch([sys.executable, script, "--steps", str(steps)], boot, ranks=ranks, cluster=c, log_dir=logs, timeout_s=600)
    with open(os.path.join(logs, "rank0.log")) as f:
        m = MEDIAN.search(f.read())
    return {"ranks": ranks, "profiled": profile, "load": load, "median_ms": float(m.group(1)) if m else None, "folder": folder}


def measure(a) -> None:
    from dagprof.collect.jobs.netns import Cluster

    os.makedirs(a.keep, exist_ok=True)
    rows = []
    with Cluster(max(a.workers)) as c:
        c.set_rate(a.rate)
        for k in range(a.rounds):
            rows.append(job(c, 2, a.steps, os.path.join(a.keep, f"prof-{k}"), True) | {"round": k})
            counts = [2, *a.workers]
            for n in counts if k % 2 == 0 else counts[::-1]:
                rows.append(job(c, n, a.steps, os.path.join(a.keep, f"n{n}-{k}"), False) | {"round": k})
                print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(a.keep, "measured.json"), "w") as f:
        json.dump({"rate": a.rate, "rows": rows}, f, indent=1)


def predicted_ms(src: str, run: str, args: list[str]) -> float:
    r = subprocess.run([sys.executable, "-m", "dagprof.cli.main", "whatif", run, *args, "--json"], env=dict(os.environ, PYTHONPATH=src),
                       capture_output=True, text=True, check=True)
    return float(json.loads(r.stdout)["scenarios"][0]["predicted_iter_ms"])


def predict(a) -> None:
    with open(os.path.join(a.keep, "measured.json")) as f:
        rows = json.load(f)["rows"]
    sides = [("after", os.path.join(TREE, "src"))] + ([("before", os.path.join(a.before, "src"))] if a.before else [])
    print("round | workers | side | predicted ms | measured ms (load) | error")
    for r in rows:
        if r["profiled"] or not r["median_ms"]:
            continue
        run = os.path.join(a.keep, f"prof-{r['round']}")
        for side, src in sides:
            got = predicted_ms(src, run, ["--workers", str(r["ranks"]), "--cores", str(os.cpu_count())])
            print(f"{r['round']} | {r['ranks']} | {side} | {got:.0f} | {r['median_ms']:.0f} ({r['load']:.1f}) | "
                  f"{100 * (got / r['median_ms'] - 1):+.1f} %")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", required=True)
    ap.add_argument("--rate", type=float, default=200e6, help="bit/s on each rank's port")
    ap.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[3, 4])
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--predict", action="store_true", help="predict the kept runs (no job, no root)")
    ap.add_argument("--before", default="", help="with --predict: another checkout (holding src/) predicting too")
    a = ap.parse_args()
    predict(a) if a.predict else measure(a)


if __name__ == "__main__":
    main()
