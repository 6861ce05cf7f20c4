"""``zero1_overlap.py`` (ZeRO-1 stepped inside DDP's comm hook) on the namespace testbed (root): the replay of a 1 Gbit/s
profile and ``dagprof whatif --bandwidth 200Mbit --profiled-bandwidth 1Gbit`` against the script measured unprofiled.

Each rank in its own network namespace, its port shaped (``collect.jobs.netns.Cluster``: a switch, where a broadcast
and a ring all-reduce of the same bytes cost alike on 2 ranks; the shared loopback of ``shaped_loopback.py`` carries
an all-reduce's bytes twice and a broadcast's once). Per round: the 2-rank job profiled at 1 Gbit/s (steps 5-9), then
unprofiled at 1 Gbit/s and 200 Mbit/s (their order alternating by round); each figure the script's median step from
step 5 on, the 1-minute load before the job beside it. Predictions come afterwards from the kept profiles:

    flock /tmp/dagprof-measure.lock python bench/ddp_fresh/zero1_overlap_check.py --keep /tmp/zo/tb --rounds 2
    python bench/ddp_fresh/zero1_overlap_check.py --keep /tmp/zo/tb --predict
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "zero1_overlap.py")
RATES = {"1Gbit": 1e9, "200Mbit": 200e6}

sys.path.insert(0, HERE)
from zero1_workers import job  # noqa: E402


def measure(a) -> None:
    from dagprof.collect.jobs.netns import Cluster

    os.makedirs(a.keep, exist_ok=True)
    rows = []
    with Cluster(2) as c:
        for k in range(a.rounds):
            c.set_rate(RATES["1Gbit"])
            rows.append(job(c, 2, a.steps, os.path.join(a.keep, f"prof-{k}"), True, SCRIPT) | {"round": k, "rate": "1Gbit"})
            for rate in list(RATES) if k % 2 == 0 else list(RATES)[::-1]:
                c.set_rate(RATES[rate])
                rows.append(job(c, 2, a.steps, os.path.join(a.keep, f"{rate}-{k}"), False, SCRIPT) | {"round": k, "rate": rate})
                print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(a.keep, "measured.json"), "w") as f:
        json.dump(rows, f, indent=1)


def whatif(run: str, rate: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "dagprof.cli.main", "whatif", run, "--bandwidth", rate, "--profiled-bandwidth", "1Gbit",
                        "--allow-model-error", "--no-trace", "--json"], env=dict(os.environ, PYTHONPATH=os.path.join(TREE, "src")),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def predict(a) -> None:
    with open(os.path.join(a.keep, "measured.json")) as f:
        rows = json.load(f)
    print("round | rate | predicted ms (model of the profiled run's error) | measured ms (load) | error")
    for r in rows:
        if r["profiled"] or not r["median_ms"]:
            continue
        out = whatif(os.path.join(a.keep, f"prof-{r['round']}"), r["rate"])
        got = out["scenarios"][0]["predicted_iter_ms"]
        print(f"{r['round']} | {r['rate']} | {got:.0f} ({out['model_error_pct']:+.1f} %) | {r['median_ms']:.0f} ({r['load']:.1f}) | "
              f"{100 * (got / r['median_ms'] - 1):+.1f} %")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", required=True)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--predict", action="store_true", help="predict the kept runs (no job, no root)")
    a = ap.parse_args()
    predict(a) if a.predict else measure(a)


if __name__ == "__main__":
    main()
