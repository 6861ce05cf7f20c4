"""Profile testbed cells with dagprof, each as ``run.py`` profiles its one cell, and print where each cell's step goes.

    flock /tmp/dagprof-measure.lock python bench/testbed/profile_cells.py DIR 1@1Gbit 25@unlimited

Each CAP@LINK (bucket MB, one of ``run.RATES``) is profiled in its own launch, back to back, into ``DIR/CAP@LINK/run``;
then per cell, rank by rank, the median over the profiled steps of each kind's time on the training thread (forward,
backward, optimizer, the rest, the buckets' issue) and of the collectives' spans a step. Written for issue 20's
unshaped 25 MB cell: the testbed predicts it from the 1 Gbit/s 1 MB profile, whose backward runs beside its buckets'
all-reduces, where the 25 MB cell's one bucket follows the backward.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

from run import RATES, launch


def parts(run_dir: str) -> list[str]:
    """Per rank, the median per profiled step of each kind's summed op time (ms), and of the collectives' spans."""
    from dagprof.pipeline import open_run
    from dagprof.traces.events import Kind

    g = open_run(run_dir).graph
    steps = sorted({int(s) for s in g.step if s >= 0})
    kinds = (Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE, Kind.OTHER, Kind.COMM_ENQUEUE)
    lines = []
    for r in sorted({int(x) for x in g.rank if x >= 0}):
        per = {k.name.lower(): statistics.median(float(g.dur[(g.step == s) & (g.rank == r) & (g.kind == k)].sum()) / 1e3 for s in steps)
               for k in kinds}
        lines.append(f"rank {r}: " + ", ".join(f"{k} {v:.2f}" for k, v in per.items()))
    comm = statistics.median(float(g.dur[(g.step == s) & (g.rank < 0) & (g.kind == Kind.COMM)].sum()) / 1e3 for s in steps)
    lines.append(f"collectives {comm:.2f} ms a step ({len(steps)} steps)")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("cells", nargs="+", metavar="CAP@LINK")
    ap.add_argument("--ranks", type=int, default=2)
    a = ap.parse_args()
    args = argparse.Namespace(warmup=2, steps=5, profile_steps=8, profile_margin=3, batch=32, width=768, depth=8)  # run.py's
    for spec in a.cells:
        cap, _, link = spec.partition("@")
        if link not in RATES:
            ap.error(f"{spec}: LINK must be one of {', '.join(RATES)}")
        control = os.path.join(a.out, spec)
        steps = launch(a.ranks, [(f"profile:{float(cap):g}", RATES[link])], args, control)[0]
        print(f"{spec}: steps {', '.join(f'{t * 1e3:.1f}' for t in steps)} ms")
        for line in parts(os.path.join(control, "run")):
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
