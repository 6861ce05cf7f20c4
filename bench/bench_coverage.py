"""How often the 90 % intervals hold what was measured after the profile, pooled over kept testbed runs (issue 20).

No job and no root: every kept run is predicted again with this dagprof, offline, and each interval is held against
steps the job ran AFTER the profile it was predicted from:

- ``--testbed KEPT``: ``bench/testbed/run.py --keep`` rounds (``KEPT/<round>/r<ranks>/``; ``tests/data/ddp-testbed`` is
  one such 2-rank round's ``r2``: pass its parent laid out as ``KEPT/0/r2``): every cell predicted from the round's
  profile, as ``run.py --repredict`` does (corrected for the profiler's cost, dagprof's default), against each timed step
  of the cell (same processes, after the profile);
- ``--optimize KEPT``: ``bench/bench_optimize.py --keep`` folders (``KEPT/w<i>-<ranks>/``): ``dagprof optimize``'s
  interval for the profiled setup (the defaults), found again on the searched profile (``closeloop.find_strategy``,
  lossless, its link file where kept), against every verification round's run of the defaults (``round<k>-A``, after
  the profile), each step past the warm-up (``WARMUP_FRACTION``: what ``--verify`` skips) as the slowest rank's.

The interval is a prediction interval for ONE step (``analysis.interval``): single steps are what it is judged on,
pooled over every source; the rounds' median steps inside are printed beside, since ``bench_optimize`` reports those.
The S-SGD testbed (``bench_sgd.py --testbed``) is not pooled: ``dagprof sgd`` gives no interval.

    .venv/bin/python bench/bench_coverage.py --testbed KEPT... --optimize KEPT... [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "testbed"))


@dataclass
class Tally:
    """Single steps inside / below / above their interval, and round medians inside, for one source."""

    name: str
    inside: int = 0
    below: int = 0
    above: int = 0
    medians: list[bool] = field(default_factory=list)
    widths: list[float] = field(default_factory=list)  # (hi - lo) / point per interval
    level_below: int = 0  # steps below in runs whose median step is below too: the run's level, not one step, missed
    level_above: int = 0  # the same above

    def add(self, iv, steps_us: list[float]) -> None:
        below, above = sum(t < iv.lo_us for t in steps_us), sum(t > iv.hi_us for t in steps_us)
        self.inside += len(steps_us) - below - above
        self.below, self.above = self.below + below, self.above + above
        self.medians.append(iv.contains(statistics.median(steps_us)))
        self.level_below += 0 if self.medians[-1] else below
        self.level_above += 0 if self.medians[-1] else above
        self.widths.append((iv.hi_us - iv.lo_us) / iv.point_us)

    @property
    def steps(self) -> int:
        return self.inside + self.below + self.above

    def line(self) -> str:
        n = max(self.steps, 1)
        return (f"{self.name}: {self.inside} of {self.steps} steps inside ({100 * self.inside / n:.0f} %; {self.below} below, "
                f"{self.above} above; {self.level_below} and {self.level_above} of them in runs whose median step missed too); round medians "
                f"inside {sum(self.medians)} of {len(self.medians)}; interval width median {100 * statistics.median(self.widths):.0f} % of the point")


def testbed_rounds(kept: str) -> Tally:
    """Every cell of every round of a ``bench/testbed/run.py --keep`` folder, from its round's own profile."""
    import random

    from run import CAPS_MB, PROFILED, RATES, SWEPT, one_round

    t = Tally(f"testbed {kept}")
    rounds = sorted(d for d in os.listdir(kept) if d.isdigit())
    ranks = sorted(int(d[1:]) for d in os.listdir(os.path.join(kept, rounds[0])) if d.startswith("r") and d[1:].isdigit())
    args = argparse.Namespace(profiled=PROFILED, swept=SWEPT, ranks=ranks, rates=list(RATES), caps=CAPS_MB, cores=os.cpu_count() or 1,
                              calibrated={}, repredict=kept)
    for k in rounds:
        measured, _, intervals = one_round(args, os.path.join(kept, k), random.Random(0))
        for cell, steps_ms in measured.items():
            t.add(intervals[("corrected", *cell)], [x * 1e3 for x in steps_ms])
    return t


def optimize_rounds(kept: str) -> Tally:
    """The defaults' interval from each searched profile of a ``bench_optimize.py --keep`` folder, against its verification
    rounds' runs of the defaults."""
    from dagprof.closeloop import find_strategy
    from dagprof.collect.hooks.steptimes import WARMUP_FRACTION, read_times
    from dagprof.search.optimize import Options

    t = Tally(f"optimize {kept}")
    for name in sorted(d for d in os.listdir(kept) if d.startswith("w") and os.path.isdir(os.path.join(kept, d, "run"))):
        work = os.path.join(kept, name)
        link = os.path.join(work, "link.json")
        with tempfile.TemporaryDirectory(prefix="dagprof-coverage-") as out:
            found = find_strategy(os.path.join(work, "run"), Options(budget_s=1, seed=0, link_model=link if os.path.exists(link) else None), out)
        iv = found.search.intervals["baseline"]
        for mode in ("lossless", "lossy"):
            k = 0
            while os.path.isdir(folder := os.path.join(work, mode, "verify", f"round{k}-A")):
                per_rank = read_times(os.path.join(folder, "times"))
                n = min(len(r["step_s"]) for r in per_rank)
                skip = min(int(n * WARMUP_FRACTION), n - 1)
                t.add(iv, [1e6 * max(r["step_s"][i] / max(r["micro_batches"][i], 1) for r in per_rank) for i in range(skip, n)])
                k += 1
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", nargs="*", default=[], metavar="KEPT", help="bench/testbed/run.py --keep folders")
    ap.add_argument("--optimize", nargs="*", default=[], metavar="KEPT", help="bench/bench_optimize.py --keep folders")
    ap.add_argument("--out", default=None, help="write the tallies as JSON here")
    args = ap.parse_args()
    tallies = [testbed_rounds(k) for k in args.testbed] + [optimize_rounds(k) for k in args.optimize]
    if not tallies:
        ap.error("give --testbed and/or --optimize folders")
    for t in tallies:
        print(t.line())
    pooled = Tally("pooled")
    for t in tallies:
        pooled.inside, pooled.below, pooled.above = pooled.inside + t.inside, pooled.below + t.below, pooled.above + t.above
        pooled.medians += t.medians
        pooled.level_below, pooled.level_above = pooled.level_below + t.level_below, pooled.level_above + t.level_above
        pooled.widths += t.widths
    print(pooled.line() + " (goal: 80-95 % of steps inside the 90 % intervals)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump([{"source": t.name, "inside": t.inside, "below": t.below, "above": t.above, "level_below": t.level_below,
                        "level_above": t.level_above,
                        "medians_inside": t.medians,
                        "widths": t.widths} for t in [*tallies, pooled]], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
