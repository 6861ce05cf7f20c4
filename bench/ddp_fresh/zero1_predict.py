"""The what-if table of ``zero1_measure.py``'s kept runs: each prediction (``dagprof whatif`` of a checkout, on the profile
its own collector made: ``prof-*`` this tree's, ``prof-before-*`` the ``--before`` tree's) against the measured job's
median step. The testbed's rates are given as its model links (``shaped_loopback.wire_rate``: rate / 2 of payload for
the pair that shares the one shaped loopback), profiled at the faster one; ``--workers`` with the host's cores (4 ranks
queue on its 2).

    python bench/ddp_fresh/zero1_predict.py /tmp/zero1/tb [--before BEFORE]

Each round's rows are predicted from that round's profile (``round`` in ``measured.json``; round 0's where it has none).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))

from shaped_loopback import wire_rate  # noqa: E402


def predict(src: str, run: str, args: list[str]) -> float:
    """The first scenario's predicted iteration (ms) of ``dagprof whatif RUN ARGS --json`` with the checkout ``src``."""
    r = subprocess.run([sys.executable, "-m", "dagprof.cli.main", "whatif", run, *args, "--json"], env=dict(os.environ, PYTHONPATH=src),
                       capture_output=True, text=True, check=True)
    return float(json.loads(r.stdout)["scenarios"][0]["predicted_iter_ms"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kept")
    ap.add_argument("--before", default="")
    a = ap.parse_args()
    with open(os.path.join(a.kept, "measured.json")) as f:
        rows = json.load(f)
    plain = [r for r in rows if not r["profiled"] and r["median_ms"]]
    rates = sorted({r["rate"] for r in rows if r["rate"]}, reverse=True)
    host = [r for r in plain if r["rate"] is None]
    cases = []  # (command, profile tag, whatif args, measured row)
    for r in (r for r in plain if r["rate"]):
        cases.append((f"whatif --bandwidth {r['rate'] / 1e6:g}Mbit (testbed)", f"{rates[0] / 1e6:g}-{r.get('round', 0)}",
                      ["--bandwidth", wire_rate(r["rate"], 2), "--profiled-bandwidth", wire_rate(rates[0], 2)], r))
    for r in host:
        if r["ranks"] != 2:
            cases.append((f"whatif --workers {r['ranks']} --cores {os.cpu_count()}", f"host-{r.get('round', 0)}",
                          ["--workers", str(r["ranks"]), "--cores", str(os.cpu_count())], r))
        elif "--bucket-cap-mb" in r["args"]:
            mb = r["args"][r["args"].index("--bucket-cap-mb") + 1]
            cases.append((f"whatif --bucket-mb {mb}", f"host-{r.get('round', 0)}", ["--bucket-mb", mb], r))
        else:
            cases.append(("whatif --workers 2 (the profiled setup)", f"host-{r.get('round', 0)}", ["--workers", "2"], r))
    sides = [("after", os.path.join(TREE, "src"), "prof-")] + ([("before", os.path.join(a.before, "src"), "prof-before-")] if a.before else [])
    print("command | side | predicted ms | measured ms (load) | error")
    for name, tag, args, r in cases:
        for side, src, prefix in sides:
            run = os.path.join(a.kept, prefix + tag)
            if not os.path.isdir(run):  # a script that profiles itself (zero1_measure.py --plain-profiler): one profile, both checkouts
                run = os.path.join(a.kept, "prof-" + tag)
            got = predict(src, run, args)
            print(f"{name} | {side} | {got:.1f} | {r['median_ms']:.1f} ({r['load']:.1f}) | {100 * (got / r['median_ms'] - 1):+.1f} %")


if __name__ == "__main__":
    main()
