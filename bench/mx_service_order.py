"""The order a parameter server's port served the workers, measured in the rounds ``bench_mxnet_ps.py --keep`` kept.

ps-lite's server answers each key's requests in arrival order, and a ``dist_sync`` key is answered once every worker
pushed it; the replay shares a server's port fairly among the copies of a worker, so their last pulls come in together
(``bench_mxnet_ps.py``'s "their last pulls apart", 2-5 ms for 3 workers). This reads each kept cell's own profiled
steps (mx.profiler: each worker's push/pull ops on the shared clock) and prints, per folder: in how many steps the
worker that pushed first got its last pull first, in how many a step's push order was the previous step's pull order,
and how far apart the workers' last pulls came in (first to last, median and range over steps).

    .venv/bin/python bench/mx_service_order.py --cell s1_200M_w3 KEPT [KEPT...]
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys

import numpy as np

from dagprof.traces.events import CommRole, Kind
from dagprof.traces.load import load


def exchanges(run_dir: str) -> dict[int, dict[int, tuple[float, float]]]:
    """step -> worker -> (its first push's start, its last pull's end), us on the shared clock."""
    out: dict[int, dict[int, tuple[float, float]]] = {}
    for t in load(run_dir).ranks:
        ev, base = t.events, t.base_ns / 1e3
        sel = (ev.kind == Kind.COMM) & (ev.role != CommRole.ROWS)
        for s in np.unique(ev.step[sel]).tolist():
            mine = sel & (ev.step == s)
            out.setdefault(int(s), {})[t.rank] = (base + float(ev.start[mine].min()), base + float((ev.start[mine] + ev.dur[mine]).max()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kept", nargs="+", help="folders kept by bench_mxnet_ps.py --keep")
    ap.add_argument("--cell", default="s1_200M_w3", help="the cell's folder in each round (default: 3 workers, 1 server, 200 Mbit/s)")
    args = ap.parse_args()
    for kept in args.kept:
        steps = first = carried = pairs = 0
        apart = []
        for run_dir in sorted(glob.glob(os.path.join(kept, "round*", args.cell))):
            before = None
            for _, per in sorted(exchanges(run_dir).items()):
                pushed = sorted(per, key=lambda w: per[w][0])
                served = sorted(per, key=lambda w: per[w][1])
                steps += 1
                first += pushed[0] == served[0]
                if before is not None:
                    pairs += 1
                    carried += pushed == before
                before = served
                apart.append((per[served[-1]][1] - per[served[0]][1]) / 1e3)
        if not steps:
            print(f"{kept}: no {args.cell} cell kept", file=sys.stderr)
            continue
        print(f"{os.path.basename(kept.rstrip('/'))} ({args.cell}): {steps} profiled steps; the first to push got its last pull first in "
              f"{first}; a step's push order was the previous step's pull order in {carried} of {pairs}; last pulls first to last "
              f"{statistics.median(apart):.0f} ms ({min(apart):.0f}..{max(apart):.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
