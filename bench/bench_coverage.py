"""How often the 90 % intervals hold what was measured after the profile, per bench, over kept testbed runs (issue 20).

No job and no root: every kept run is predicted again with this dagprof, offline, and each interval is held against
runs of the job measured AFTER the profile it was predicted from. The interval is for a run's median step
(``analysis.interval``): each run's median step is the verdict; its single steps inside are printed beside (they spread
wider than a median, so fewer of them are inside).

- ``--testbed KEPT``: ``bench/testbed/run.py --keep`` rounds (``KEPT/<round>/r<ranks>/``; ``tests/data/ddp-testbed`` is
  one such 2-rank round's ``r2``: pass its parent laid out as ``KEPT/0/r2``): every cell predicted from the round's
  profile, as ``run.py --repredict`` does (corrected for the profiler's cost, dagprof's default), against the cell's
  timed steps (same processes, after the profile);
- ``--optimize KEPT``: ``bench/bench_optimize.py --keep`` folders (``KEPT/w<i>-<ranks>/``): ``dagprof optimize``'s
  interval for the profiled setup (the defaults), found again on the searched profile (``closeloop.find_strategy``,
  lossless, its link file where kept), against every verification round's run of the defaults (``round<k>-A``, after
  the profile), each step past the warm-up (``WARMUP_FRACTION``: what ``--verify`` skips) as the slowest rank's; and the
  lossy strategy's interval (PowerSGD's, the setup the profile never ran) against every round's run of the strategy
  (``round<k>-B``), the kept strategy priced on the searched profile with the kept codec costs. ``tests/data/kept-optimize``'s
  folders are such runs' defaults only (``verify/<mode>-round<k>/``): link one as ``KEPT/w0-2``;
- ``--frameworks KEPT[=JSON]``: ``bench/bench_frameworks.py --testbed --keep`` folders (``tb-NAME-K-RATEM``): each round's
  bandwidth what-if from the profile at one rate, as ``--repredict`` predicts it, against the job run at the other rate:
  its unprofiled steps past the warm-up (what the interval is for); the median of its profiled window (what
  ``bench_frameworks`` reports) beside. ``JSON``: that bench's ``--json`` output, for each job's load.

Load: each source's ``KEPT.load`` (``HH:MM:SS load1 load5 load15`` or ``uptime`` lines, as the benches' wrappers log
them), else the frameworks bench's JSON, else the load noted when it was kept (``--testbed`` / ``--optimize KEPT=LOAD``);
a source is loaded where the highest 1-minute load exceeds ``LOADED`` (twice the cores of the 2-core testbed), and
``load unknown`` is said where none is kept.

Both ways: the interval as dagprof gives it, and widened (in quadrature, normal quantile) by the run-to-run drift the
bench measured across its rounds (the relative standard deviation of the same configuration's measured median steps,
this round's among them): what an interval from one profile cannot see. The testbed's cells are tallied by link too
(shaped: the profiled rate scaled; unshaped: loopback, priced by the sweep, a link the profile never ran on).

    .venv/bin/python bench/bench_coverage.py --testbed KEPT[=LOAD]... --optimize KEPT[=LOAD]... --frameworks KEPT[=JSON]... [--out FILE]
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "testbed"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LOADED = 4.0
Z90 = statistics.NormalDist().inv_cdf(0.95)


@dataclass
class Run:
    """One measured run against its interval (us): its median step, its single steps, and the configuration it ran."""

    config: str
    lo: float
    point: float
    hi: float
    steps: list[float]
    median: float | None = None  # default: the steps' median
    link: str = ""  # testbed cells: "shaped" (tc's rate) or "unshaped" (loopback, priced by the sweep); else ""
    kind: str = "defaults"  # optimize rounds: the profiled setup's runs, or the lossy "strategy"'s

    @property
    def measured(self) -> float:
        return statistics.median(self.steps) if self.median is None else self.median


@dataclass
class Tally:
    """The runs of one source, and the load they were measured under (None: not kept)."""

    name: str
    load: float | None
    runs: list[Run] = field(default_factory=list)

    def drift(self) -> dict[str, float]:
        """Per configuration: the relative standard deviation of its runs' measured median steps across rounds (0 for one)."""
        by: dict[str, list[float]] = {}
        for r in self.runs:
            by.setdefault(r.config, []).append(r.measured)
        return {c: statistics.stdev(m) / statistics.mean(m) if len(m) >= 2 else 0.0 for c, m in by.items()}

    def counts(self) -> dict:
        drift = self.drift()
        inside = sum(r.lo <= r.measured <= r.hi for r in self.runs)
        below = sum(r.measured < r.lo for r in self.runs)
        steps = [t for r in self.runs for t in r.steps]
        steps_in = sum(r.lo <= t <= r.hi for r in self.runs for t in r.steps)
        with_drift = sum(_widened(r, drift[r.config]) for r in self.runs)
        widths = [(r.hi - r.lo) / r.point for r in self.runs]
        return {"runs": len(self.runs), "inside": inside, "below": below, "above": len(self.runs) - inside - below,
                "inside_with_drift": with_drift, "steps": len(steps), "steps_inside": steps_in,
                "width_median_pct": 100 * statistics.median(widths) if widths else None,
                "drift_median_pct": 100 * statistics.median(drift.values()) if drift else None}

    def line(self) -> str:
        c = self.counts()
        if not c["runs"]:
            return f"{self.name}: no kept run found there (see --help for each source's layout)"
        n = c["runs"]
        load = "load unknown" if self.load is None else f"load up to {self.load:.1f}"
        return (f"{self.name} ({load}): {c['inside']} of {c['runs']} run medians inside ({100 * c['inside'] / n:.0f} %; {c['below']} below, "
                f"{c['above']} above), {c['inside_with_drift']} with the rounds' drift ({c['drift_median_pct']:.0f} % median); single steps "
                f"{c['steps_inside']} of {c['steps']}; interval width median {c['width_median_pct']:.0f} % of the point")


def _widened(r: Run, drift: float) -> bool:
    """``r``'s median inside its interval widened by ``drift`` (a share) in quadrature on each side."""
    lo = math.hypot(1 - r.lo / r.point, Z90 * drift)
    hi = math.hypot(r.hi / r.point - 1, Z90 * drift)
    return r.point * (1 - lo) <= r.measured <= r.point * (1 + hi)


def load_of(spec: str) -> tuple[str, float | None]:
    """``KEPT[=LOAD]``: the folder and the highest 1-minute load in ``KEPT.load``, else the ``LOAD`` noted when it was kept,
    else None."""
    kept, _, noted = spec.partition("=")
    logged = load_log(kept)
    return kept, logged if logged is not None or not noted else float(noted)


def load_log(kept: str) -> float | None:
    """The highest 1-minute load in ``KEPT.load`` (``HH:MM:SS load1 ...`` or ``uptime`` lines); None where none is kept."""
    try:
        with open(kept.rstrip("/") + ".load") as f:
            return max(float(line.split("load average:")[1].split(",")[0] if "load average:" in line else line.split()[1]) for line in f if line.strip())
    except (OSError, ValueError, IndexError):
        return None


def testbed_rounds(spec: str) -> Tally:
    """Every cell of every round of a ``bench/testbed/run.py --keep`` folder, from its round's own profile."""
    import random

    from run import CAPS_MB, PROFILED, RATES, SWEPT, one_round

    kept, load = load_of(spec)
    t = Tally(f"testbed {kept}", load)
    rounds = sorted(d for d in os.listdir(kept) if d.isdigit())
    ranks = sorted(int(d[1:]) for d in os.listdir(os.path.join(kept, rounds[0])) if d.startswith("r") and d[1:].isdigit())
    args = argparse.Namespace(profiled=PROFILED, swept=SWEPT, ranks=ranks, rates=list(RATES), caps=CAPS_MB, cores=os.cpu_count() or 1,
                              calibrated={}, repredict=kept)
    for k in rounds:
        measured, _, intervals = one_round(args, os.path.join(kept, k), random.Random(0))
        for cell, steps_ms in measured.items():
            iv = intervals[("corrected", *cell)]
            t.runs.append(Run(repr(cell), iv.lo_us, iv.point_us, iv.hi_us, [x * 1e3 for x in steps_ms],
                              link="shaped" if RATES[cell[1]] else "unshaped"))
    return t


def optimize_rounds(spec: str) -> Tally:
    """The defaults' interval from each searched profile of a ``bench_optimize.py --keep`` folder, against its verification
    rounds' runs of the defaults; and the kept lossy strategy's, priced on that profile with the kept codec costs
    (``Options.strategy``: a search again may find another layout within the tie), against its runs of the strategy."""
    import shutil

    from dagprof.closeloop import CODEC_COSTS_FILE, find_strategy
    from dagprof.collect.deploy.strategy import load_strategy
    from dagprof.collect.hooks.steptimes import WARMUP_FRACTION, read_times
    from dagprof.search.optimize import Options

    def steps_of(times: str) -> list[float]:
        per_rank = read_times(times)
        n = min(len(r["step_s"]) for r in per_rank)
        skip = min(int(n * WARMUP_FRACTION), n - 1)
        return [1e6 * max(r["step_s"][i] / max(r["micro_batches"][i], 1) for r in per_rank) for i in range(skip, n)]

    def rounds(work: str, mode: str, side: str) -> list[str]:
        """Each verification round's step-time folder: ``MODE/verify/round<k>-SIDE/times`` as kept, or the vendored copies'
        ``verify/MODE-round<k>/`` (``tests/data/kept-optimize``: the defaults' runs only)."""
        kept = (os.path.join(work, mode, "verify", f"round{k}-{side}", "times") for k in itertools.count())
        vendored = (os.path.join(work, "verify", f"{mode}-round{k}") for k in itertools.count())
        return list(itertools.takewhile(os.path.isdir, vendored if side == "A" and os.path.isdir(os.path.join(work, "verify")) else kept))

    kept, load = load_of(spec)
    t = Tally(f"optimize {kept}", load)
    for name in sorted(d for d in os.listdir(kept) if d.startswith("w") and os.path.isdir(os.path.join(kept, d, "run"))):
        work = os.path.join(kept, name)
        link = os.path.join(work, "link.json")
        link = link if os.path.exists(link) else None
        with tempfile.TemporaryDirectory(prefix="dagprof-coverage-") as out:
            found = find_strategy(os.path.join(work, "run"), Options(budget_s=1, seed=0, link_model=link), out)
        iv = found.search.intervals["baseline"]
        for mode in ("lossless", "lossy"):
            for folder in rounds(work, mode, "A"):
                t.runs.append(Run(name, iv.lo_us, iv.point_us, iv.hi_us, steps_of(folder)))
        lossy = os.path.join(work, "lossy")
        if not os.path.exists(os.path.join(lossy, "strategy.json")) or not os.path.exists(os.path.join(lossy, CODEC_COSTS_FILE)):
            continue
        with tempfile.TemporaryDirectory(prefix="dagprof-coverage-") as out:
            shutil.copy(os.path.join(lossy, CODEC_COSTS_FILE), out)
            kept_strategy = load_strategy(os.path.join(lossy, "strategy.json"))
            found = find_strategy(os.path.join(work, "run"), Options(allow_lossy=True, link_model=link, strategy=kept_strategy), out)
        iv = found.search.intervals["best"]
        for folder in rounds(work, "lossy", "B"):
            t.runs.append(Run(f"{name} strategy", iv.lo_us, iv.point_us, iv.hi_us, steps_of(folder), kind="strategy"))
    return t


def frameworks_rounds(spec: str) -> Tally:
    """Every round of a ``bench_frameworks.py --testbed --keep`` folder (``KEPT[=JSON]``), predicted again as ``--repredict``
    does, against the job measured at the other rate: its unprofiled steps past the warm-up."""
    from shaped_loopback import median_step_ms, predict_rate, unprofiled_steps_us

    from dagprof.errors import DagprofError
    from dagprof.passes.profiler_cost import MIN_STEPS
    from dagprof.pipeline import open_run

    kept, _, bench_json = spec.partition("=")
    loads = {}
    if bench_json:
        with open(bench_json) as f:
            loads = {(name, r["round"]): max(r["profiled"]["load"], r["other"]["load"]) for name, got in json.load(f).items() for r in got["rounds"]}
    t = Tally(f"frameworks {kept}", max(loads.values()) if loads else load_log(kept))
    for pair_file in sorted(f for f in os.listdir(kept) if f.startswith("tb-") and f.endswith("-pair.json")):
        name = pair_file[3:-len("-pair.json")]
        with open(os.path.join(kept, pair_file)) as f:
            pair = json.load(f)
        fast, slow = pair["rate_bit"], pair["other_rate_bit"]
        k = 0
        while all(os.path.isdir(os.path.join(kept, f"tb-{name}-{k}-{int(r / 1e6)}M")) for r in (fast, slow)):
            folder = {r: os.path.join(kept, f"tb-{name}-{k}-{int(r / 1e6)}M") for r in (fast, slow)}
            k += 1
            try:
                got = predict_rate(folder[fast], fast, slow, pair.get("hosts", False))  # as hosts: each port its own, as --repredict
                g = open_run(folder[slow]).graph
            except DagprofError as e:
                print(f"{name} round {k}: not predicted ({e})", file=sys.stderr)
                continue
            steps = unprofiled_steps_us(g)
            if len(steps) < MIN_STEPS:
                print(f"{name} round {k}: {len(steps)} unprofiled steps past the warm-up measured at the other rate; left out", file=sys.stderr)
                continue
            lo, hi = (1e3 * x for x in got["interval_ms"])
            run = Run(name, lo, 1e3 * got["predicted_ms"], hi, steps)
            t.runs.append(run)
            window = 1e3 * median_step_ms(g)
            print(f"{name} round {k}: predicted {got['predicted_ms']:.1f} ms ({lo / 1e3:.1f}-{hi / 1e3:.1f}); measured median "
                  f"{run.measured / 1e3:.1f} ms unprofiled ({len(steps)} steps), {window / 1e3:.1f} ms profiled window; "
                  f"load {loads.get((name, k - 1), float('nan')):.2f}", file=sys.stderr, flush=True)
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", nargs="*", default=[], metavar="KEPT[=LOAD]", help="bench/testbed/run.py --keep folders")
    ap.add_argument("--optimize", nargs="*", default=[], metavar="KEPT[=LOAD]", help="bench/bench_optimize.py --keep folders")
    ap.add_argument("--frameworks", nargs="*", default=[], metavar="KEPT[=JSON]",
                    help="bench/bench_frameworks.py --testbed --keep folders (=JSON: that run's --json output, for its loads)")
    ap.add_argument("--out", default=None, help="write the tallies as JSON here")
    args = ap.parse_args()
    tallies = ([testbed_rounds(k) for k in args.testbed] + [optimize_rounds(k) for k in args.optimize]
               + [frameworks_rounds(k) for k in args.frameworks])
    if not tallies:
        ap.error("give --testbed, --optimize and/or --frameworks folders")
    for t in tallies:
        print(t.line())
    groups = {"quiet": [t for t in tallies if t.load is not None and t.load <= LOADED],
              "loaded": [t for t in tallies if t.load is not None and t.load > LOADED],
              "load unknown": [t for t in tallies if t.load is None]}
    groups |= {kind: [t for t in tallies if t.name.startswith(kind)] for kind in ("testbed", "optimize", "frameworks")}
    # The testbed's links apart: a shaped cell's link is the profiled one's rate scaled, an unshaped cell's is priced by the
    # sweep, a link the profile never ran on; pooled, the shaped cells' coverage hid the unshaped ones'.
    groups |= {f"testbed {kind}": [Tally(t.name, t.load, [r for r in t.runs if r.link == kind]) for t in groups["testbed"]]
               for kind in ("shaped", "unshaped")}
    # the optimizer's two intervals apart: the profiled setup's, undisturbed and disturbed alike, and the lossy strategy's,
    # which the profile never ran
    groups |= {f"optimize {kind}": [Tally(t.name, t.load, [r for r in t.runs if r.kind == kind]) for t in groups["optimize"]]
               for kind in ("defaults", "strategy")}
    for label, ts in [*groups.items(), ("pooled", tallies)]:
        if any(t.runs for t in ts):
            pooled = Tally(label, None, [r for t in ts for r in t.runs])
            c = pooled.counts()
            with_drift = sum(t.counts()["inside_with_drift"] for t in ts)  # each source's own rounds' drift
            print(f"{label} ({len(ts)} sources): {c['inside']} of {c['runs']} run medians inside ({100 * c['inside'] / max(c['runs'], 1):.0f} %; "
                  f"{c['below']} below, {c['above']} above), {with_drift} with the rounds' drift; single steps {c['steps_inside']} of "
                  f"{c['steps']}; width median {c['width_median_pct']:.0f} % of the point")
    print("goal: 80-95 % of run medians inside the 90 % intervals. The drift of a shared machine's level between the profile and a "
          "later run is what one profile cannot see: 'with the rounds' drift' adds what the bench measured across its rounds.")
    if args.out:
        with open(args.out, "w") as f:
            json.dump([{"source": t.name, "load": t.load, **t.counts(),
                        "runs_detail": [{"config": r.config, "lo_us": r.lo, "point_us": r.point, "hi_us": r.hi, "median_us": r.measured,
                                         "steps": len(r.steps)} for r in t.runs]} for t in tallies], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
