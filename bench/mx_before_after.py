"""MXNet testbed rounds kept by ``bench_mxnet_ps.py --keep``, predicted again by two (or more) dagprof trees.

A model change is judged on the same recorded profiles against the same measurements: each tree's ``src`` runs
``bench_mxnet_ps.py --repredict`` on every kept folder (its own process, ``PYTHONPATH`` = the tree), and the table gives per
cell (servers, rate, workers) the measured step and each tree's predicted step and error, median over rounds and per
round; a worker count past the host's cores also with its compute queued on them (``whatif --cores``).

    .venv/bin/python bench/mx_before_after.py --tree before=/tmp/old/src --tree after=src --more-workers 3 KEPT [KEPT...]

The rounds themselves come from one hold of the measuring lock each, e.g.
``dp-excl .venv/bin/python bench/bench_mxnet_ps.py --python MXNET_VENV/bin/python --script bench/frameworks/mx_deepfm_workers.py
--more-workers 3 --rounds 4 --budget-s 320 --keep KEPT``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_mxnet_ps.py")


def repredict(src: str, kept: str, extra: list[str]) -> list[dict]:
    """The rows ``bench_mxnet_ps.py --repredict`` writes for ``kept`` with the dagprof of ``src``."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
        done = subprocess.run([sys.executable, BENCH, "--repredict", kept, "--json", f.name, *extra], env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"mx_before_after: {kept} with {src}: {(done.stderr.strip().splitlines() or ['exit ' + str(done.returncode)])[-1]}")
        with open(f.name) as g:
            return json.load(g)


def table(kept: str, by_tree: dict[str, list[dict]]) -> list[dict]:
    """One row per cell: measured and each tree's predictions (median over rounds, and per round), errors in %."""
    first = next(iter(by_tree.values()))
    cells = list(dict.fromkeys((r["servers"], r["rate_bit"], r["workers"]) for r in first))
    out = []
    for c in cells:
        rounds = sorted({r["round"] for r in first if (r["servers"], r["rate_bit"], r["workers"]) == c})
        meas = {r["round"]: r["iter_ms"] for r in first if (r["servers"], r["rate_bit"], r["workers"]) == c}
        row = {"kept": kept, "servers": c[0], "rate_mbit": c[1] / 1e6, "workers": c[2], "measured_ms": [meas[k] for k in rounds]}
        for name, rows in by_tree.items():
            mine = {r["round"]: r for r in rows if (r["servers"], r["rate_bit"], r["workers"]) == c}
            row[name] = [mine[k]["pred_iter_ms"] for k in rounds]
            if any(mine[k]["cores_iter_ms"] is not None for k in rounds):
                row[name + " queued"] = [mine[k]["cores_iter_ms"] for k in rounds]
        out.append(row)
    return out


def err(p: float, m: float) -> float:
    return 100 * (p - m) / m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kept", nargs="+", help="folders kept by bench_mxnet_ps.py --keep")
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=SRC", help="a dagprof tree's src folder, named")
    ap.add_argument("--more-workers", default="3", help="as the kept rounds were run")
    ap.add_argument("--rate", default="500e6")
    ap.add_argument("--other-rate", default="200e6")
    ap.add_argument("--json", default=None, help="also write the table here")
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    extra = ["--more-workers", args.more_workers, "--rate", args.rate, "--other-rate", args.other_rate]
    rows = []
    for kept in args.kept:
        rows += table(kept, {name: repredict(src, kept, extra) for name, src in trees.items()})
    names = list(dict.fromkeys(k for r in rows for k in r if k not in ("kept", "servers", "rate_mbit", "workers", "measured_ms")))
    print("per cell: measured step (the workers' mean median unprofiled step, median over rounds) and each tree's prediction "
          "(whatif's job step from the round's own profile) with its error; per round after the bar")
    for r in rows:
        m = r["measured_ms"]
        head = f"{os.path.basename(r['kept'].rstrip('/'))}: {r['workers']} workers {r['servers']} server(s) {r['rate_mbit']:g} Mbit/s"
        parts = [f"measured {statistics.median(m):.1f} ms"]
        for n in (n for n in names if n in r):
            parts.append(f"{n} {statistics.median(r[n]):.1f} ({err(statistics.median(r[n]), statistics.median(m)):+.1f} %)")
        per = "; ".join(f"{n} " + " / ".join(f"{err(p, q):+.1f}" for p, q in zip(r[n], m)) for n in names if n in r)
        print(f"{head}: {', '.join(parts)} | rounds' measured {' / '.join(f'{x:.1f}' for x in m)} ms; {per} %")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
