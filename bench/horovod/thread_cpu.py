"""Does a Horovod rank's other threads' CPU grow with its collectives' wall time? Per kept testbed job and rank.

A rank pinned alone to one core (``bench_frameworks.py --testbed --hosts``) shares it with its own threads: Horovod's
background loop, gloo's, rank 0's timeline writer in the profiled window. Were their CPU a rate per ms of collective in
flight, a slower wire would slow the compute beside it, which a bandwidth what-if (re-pricing the wire) would not see.
Per job folder and rank, medians over steps (ms): outside the window past the warm-up (the job as it runs unprofiled)
the step, the other threads' CPU (the process's less the training thread's, ``StepSched``) and the training thread's
run-queue wait; in the window the same, and the collectives' wall time (the union of the rank's transfers in the step),
its compute (the training thread's forward, backward and update ops) and the step less the collectives.

With ``--pairs``, per kept round (``tb-NAME-K-RATEM`` folders of ``--keep``): the other threads' CPU per step at the
slower rate less at the faster, over the collectives' wall time's change (ms of CPU per ms of collective), out of the
window and in it, per rank; the compute at the slower rate over the faster's; and the step less the collectives at each.

    python bench/horovod/thread_cpu.py /tmp/KEPT/tb-*            # one row per job and rank
    python bench/horovod/thread_cpu.py --pairs /tmp/KEPT [...]   # one row per round and rank
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from dataclasses import dataclass

import numpy as np

from dagprof.errors import DagprofError
from dagprof.graph.meta import WARMUP_STEPS
from dagprof.intervals import covered
from dagprof.pipeline import open_run
from dagprof.traces.events import Kind
from dagprof.traces.load import load

COMPUTE = (Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE)


@dataclass(frozen=True)
class RankMedians:
    """One rank of one job, medians over steps, ms (NaN where no step qualifies)."""

    step_out: float
    others_out: float
    wait_out: float
    step_in: float
    others_in: float
    wait_in: float
    comm_wall: float  # the window's collectives' wall time a step
    compute: float  # the window's forward, backward and update ops a step (the training thread's)
    outside_comm: float  # the window's step less its collectives' wall time, step by step


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def job_cpu(path: str) -> dict[int, RankMedians]:
    """Every rank's ``RankMedians`` of one job folder; {} where its collector recorded no process CPU (older runs)."""
    loop = open_run(path).graph.meta.loop_steps
    if loop is None or not loop.sched:
        return {}
    run = load(path)
    out = {}
    for t in run.ranks:
        e, sched = t.events, loop.sched.get(t.rank, {})
        main = [i for i, lane in enumerate(t.lanes) if lane.main]
        first = min(sched, default=0) + WARMUP_STEPS
        others = {s: own / 1e3 for s, x in sched.items() if (own := x.off_thread_cpu_us) is not None}  # ms, the steps that recorded it
        prof = [s for s in loop.profiled.get(t.rank, {}) if s in others]
        unprof = [s for s in loop.unprofiled.get(t.rank, {}) if s >= first and s in others]
        if not prof:
            continue
        comm, compute, outside = [], [], []
        for s in prof:
            c = (e.step == s) & (e.kind == Kind.COMM)
            comm.append(covered(e.start[c], e.start[c] + e.dur[c]) / 1e3)
            outside.append(loop.profiled[t.rank][s] / 1e3 - comm[-1])
            f = (e.step == s) & np.isin(e.kind, COMPUTE) & np.isin(e.lane, main) & (e.depth == 0)
            compute.append(float(e.dur[f].sum()) / 1e3)
        out[t.rank] = RankMedians(
            step_out=_median([loop.unprofiled[t.rank][s] / 1e3 for s in unprof]), others_out=_median([others[s] for s in unprof]),
            wait_out=_median([sched[s].wait_us / 1e3 for s in unprof]), step_in=_median([loop.profiled[t.rank][s] / 1e3 for s in prof]),
            others_in=_median([others[s] for s in prof]), wait_in=_median([sched[s].wait_us / 1e3 for s in prof]),
            comm_wall=_median(comm), compute=_median(compute), outside_comm=_median(outside))
    return out


@dataclass(frozen=True)
class PairRates:
    """One round's rank at the faster rate (A, the profiled job) and the slower (B, the measured job)."""

    fast: RankMedians
    slow: RankMedians

    @property
    def comm_change(self) -> float:
        return self.slow.comm_wall - self.fast.comm_wall

    def per_comm_ms(self, inside: bool) -> float:
        """Other threads' CPU added per ms of collective wall time added, out of the window or in it."""
        a, b = (self.fast.others_in, self.slow.others_in) if inside else (self.fast.others_out, self.slow.others_out)
        return (b - a) / self.comm_change if self.comm_change > 0 else float("nan")

    @property
    def compute_ratio(self) -> float:
        return self.slow.compute / self.fast.compute if self.fast.compute > 0 else float("nan")


def kept_pairs(kept: str) -> dict[tuple[str, int], dict[int, PairRates]]:
    """(script, round) -> rank -> ``PairRates`` of every round kept in ``kept``."""
    out = {}
    for pair_file in sorted(glob.glob(os.path.join(kept, "tb-*-pair.json"))):
        name = os.path.basename(pair_file)[3:-len("-pair.json")]
        try:
            with open(pair_file) as f:
                pair = json.load(f)
            fast, slow = (int(pair[k] / 1e6) for k in ("rate_bit", "other_rate_bit"))
        except (OSError, ValueError, TypeError, KeyError) as e:  # not a testbed round's pair file
            raise DagprofError(f"not a testbed pair file (rate_bit, other_rate_bit): {e!r}", pair_file) from None
        k = 0
        while os.path.isdir(a := os.path.join(kept, f"tb-{name}-{k}-{fast}M")) and os.path.isdir(b := os.path.join(kept, f"tb-{name}-{k}-{slow}M")):
            ja, jb = job_cpu(a), job_cpu(b)
            out[(name, k)] = {r: PairRates(ja[r], jb[r]) for r in sorted(ja) if r in jb}
            k += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="job folders, or with --pairs kept round folders")
    ap.add_argument("--pairs", action="store_true", help="per round: the slower rate's change over the faster's")
    args = ap.parse_args(argv)
    if args.pairs:
        print("round script k rank | comm wall A -> B | others out A -> B (per ms) | others in A -> B (per ms) | compute B/A | step - comm A -> B")
        for kept in args.paths:
            try:
                pairs = kept_pairs(kept)
            except DagprofError as e:
                print(f"not read: {e}", file=sys.stderr)
                return 1
            for (name, k), ranks in pairs.items():
                for r, p in ranks.items():
                    print(f"{kept} {name} {k} {r} | {p.fast.comm_wall:6.1f} -> {p.slow.comm_wall:6.1f} | {p.fast.others_out:5.1f} -> "
                          f"{p.slow.others_out:5.1f} ({p.per_comm_ms(False):+.3f}) | {p.fast.others_in:5.1f} -> {p.slow.others_in:5.1f} "
                          f"({p.per_comm_ms(True):+.3f}) | {p.compute_ratio:.2f} | {p.fast.outside_comm:5.1f} -> {p.slow.outside_comm:5.1f}")
        return 0
    print("job rank | step out/in | others out/in | wait out/in | comm wall, compute, step - comm (window)")
    failed = 0
    for path in args.paths:
        try:
            ranks = job_cpu(path)
        except DagprofError as e:  # a file the shell's glob matched beside the job folders, a damaged job: said in a line
            print(f"not read: {e}", file=sys.stderr)
            failed += 1
            continue
        for r, x in ranks.items():
            print(f"{path} {r} | {x.step_out:6.1f} {x.step_in:6.1f} | {x.others_out:5.1f} {x.others_in:5.1f} | {x.wait_out:5.1f} "
                  f"{x.wait_in:5.1f} | {x.comm_wall:6.1f} {x.compute:5.1f} {x.outside_comm:5.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
