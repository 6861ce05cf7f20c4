"""Validate the what-if engine on a real emulated cluster (run as root).

Measures DDP iteration time over a grid (link rate x bucket size x ranks) with real gloo
ranks in network namespaces, profiles ONE cell with dagprof, predicts every other cell from
that profile with the what-if passes, and prints measured vs predicted per cell.

    sudo .venv/bin/python bench/testbed/run.py            # full grid, 3 rounds, ~6 min
    sudo .venv/bin/python bench/testbed/run.py --quick    # 1 round, 2 ranks, 4 cells

The machine is shared and its load drifts by minutes, so each round runs, back to back in
the same processes, the profile of the profiled cell, a link sweep and every cell (shuffled);
each round predicts from its own profile. The table gives medians over rounds. The profile
has unprofiled steps on both sides of its window (``--profile-margin`` before, ``--steps``
after): they measure the profiler's cost and the job's drift, which widen the 90 % intervals
whose coverage of the cells' median steps per round (what the interval is for: ``analysis.interval``), single
steps beside, closes the output (``--out`` keeps, per cell and round, each interval and how many steps fell below
and above it).

How each cell is predicted from the profile (2 ranks, 1 Gbit/s, 1 MB buckets):
- link rate: the link fitted to the profiled collectives, its bandwidth scaled by the rate
  ratio (so TCP/IP framing overhead carries over); "unlimited" uses ``dagprof calibrate``'s
  sweep of the unshaped veth link (a link calibration, as nccl-tests is for GPUs);
- bucket size: ``set_buckets`` in gradient-ready order;
- 4 ranks: ``scale_workers`` (rank copies) plus ``share_cores``: the 4 ranks share this
  machine's cores, so their compute queues for the CPU (4 ranks on 2 cores contend), while a
  rank's exit lag behind an all-reduce (wire time) waits off the cores; and an
  unshaped link, being memory copies by the ranks' gloo threads, gets cores/ranks of the
  swept bandwidth. Not modelled: the longer wake-up latency of each ring step when threads
  outnumber cores (it shows as a per-bucket cost in the 4-rank cells with 1 MB buckets); that
  the copies do not fill a core (a 16 MB all-reduce on the unshaped link kept each of 2 ranks'
  CPU 37-63 % busy, each of 4 ranks' 37-44 %; 4 ranks took 1.6-3.8x the 2 ranks' time where
  this prices 3x), so the 4-rank cells with one 22 MB bucket come out 20-26 % slow.
- compute beside in-flight collectives: priced as ``dagprof whatif`` prices it, where the run or
  ``--calibrated LINK:FILE`` (``dagprof calibrate --overlap`` on that link) measured it, one file
  per link since the slowdown here does not follow the bytes per second (``predict``); a file of
  the swept link at a rank count the rounds did not sweep also gives that count's all-reduce, in
  place of ``beta * ranks / cores``. On the kept quiet rounds, with files measured later (the
  2-rank unshaped sweep then matched the rounds' own within 6 %), the profiled link's slowdown
  taken out brings the 2-rank unshaped 25 MB cell from +19 to +13 %, and 4 ranks' own sweep
  (1.3x the 2-rank time per byte, not 2x) the 4-rank unshaped cells from +13/+15/+19 to
  -2/-5/-7 %; the 2-rank 1 MB cell stays 7 % fast: there the unshaped link's all-reduces, not
  the backward, bound the step, and the model slows compute beside them but not them beside
  compute. A 4-rank sweep taken at load 3-5 priced those cells 38-51 % slow: measure it quiet,
  or in the same round as the cells.
- the unshaped link's intervals (``shared_cores``, ``analysis.interval``; ``search.shared_cores``, as ``dagprof whatif``
  puts it on a one-host profile's rows that keep its link): its all-reduces are the ranks' own CPU work,
  swept alone, and share the cores with the backward beside them (an all-reduce beside this job's backward measured
  1.19-1.28 per unit of overlap, the cores' bound 1); charged in the point, fresh quiet rounds came out 7-28 % slow, so
  the interval reaches up to the step with both slowed as far as the cores allow (or the cell's calibrate file measured),
  and, where the profiled link's slowdown was not measured, down to the profile's backward without the slowdown its
  own buckets may have put on it (the 25 MiB cells' one bucket follows a backward that runs beside nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

from dagprof.collect.jobs.netns import Cluster, Dropped, available

HERE = os.path.dirname(os.path.abspath(__file__))

RATES = {"unlimited": None, "1Gbit": 1e9, "200Mbit": 200e6}
CAPS_MB = (1.0, 5.0, 25.0)
PROFILED = (2, "1Gbit", 1.0)  # ranks, link, bucket MB of the one profiled cell
SWEPT = "unlimited"  # the link that the all-reduce sweep calibrates (the other link regime)


def launch(ranks: int, phases: list[tuple[str, float | None]], args, control: str, timeout_s: float = 900, extra: tuple[str, ...] = ()) -> list:
    """Run the worker on ``ranks`` namespaced ranks through ``phases`` of (worker phase, link rate
    in bit/s or None); returns each phase's result. ``control`` keeps logs (and the profile, in run/);
    ``extra``: more worker options (``--no-bias``)."""
    os.makedirs(control, exist_ok=True)
    with Cluster(ranks) as c:
        port = 20000 + os.getpid() % 20000
        argv = [sys.executable, os.path.join(HERE, "worker.py"), "--world", str(ranks), "--port", str(port), "--control", control,
                "--warmup", str(args.warmup), "--steps", str(args.steps), "--profile-steps", str(args.profile_steps),
                "--profile-margin", str(args.profile_margin),
                "--batch", str(args.batch), "--width", str(args.width), "--depth", str(args.depth), *extra, "--phases", *[ph for ph, _ in phases]]
        procs = [c.spawn(r, argv + ["--rank", str(r)], {"OMP_NUM_THREADS": "1"}, os.path.join(control, f"rank{r}.log")) for r in range(ranks)]
        deadline = time.monotonic() + timeout_s

        def check() -> None:
            bad = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if bad or time.monotonic() > deadline:
                with open(os.path.join(control, f"rank{bad[0] if bad else 0}.log")) as f:
                    raise RuntimeError(f"testbed ranks {bad or 'timed out'}:\n{f.read()[-2000:]}")

        dropped, before = [], None
        for k, (_, rate) in enumerate(phases):
            while not os.path.exists(os.path.join(control, f"ready{k}")):
                check()
                time.sleep(0.02)
            if k:
                dropped.append(Dropped.between(before, c.drops(), f"phase {phases[k - 1][0]}"))
            c.set_rate(rate)
            before = c.drops()
            open(os.path.join(control, f"go{k}"), "w").close()
        while any(p.poll() is None for p in procs):
            check()
            time.sleep(0.05)
        check()
        dropped.append(Dropped.between(before, c.drops(), f"phase {phases[-1][0]}"))
        report_drops(dropped, control)
        with open(os.path.join(control, "results.json")) as f:
            return json.load(f)


def report_drops(dropped: list[Dropped], control: str) -> None:
    """Each phase's packets lost by the shaped ports (dagprof models a lossless link): a warning per lossy phase, a total,
    and ``dropped.json`` in ``control``."""
    for d in dropped:
        if (line := d.warning()) is not None:
            print(f"  {line}", file=sys.stderr)
    totals = [d.total for d in dropped]
    print(f"  packets dropped: {sum(t or 0 for t in totals):,} over {len(dropped)} phases"
          f"{f' ({totals.count(None)} unreadable)' if None in totals else ''}", file=sys.stderr)
    with open(os.path.join(control, "dropped.json"), "w") as f:
        json.dump([d.to_dict() for d in dropped], f)


def one_round(args, work: str, rng: random.Random) -> tuple[dict, dict, dict]:
    """Profile + link sweep + every cell, back to back; returns (step ms per cell, predicted ms per cell, its interval
    per cell: raw, and ("corrected", *cell) as dagprof predicts by default)."""
    ranks0, rate0, cap0 = args.profiled
    measured: dict[tuple[int, str, float], list[float]] = {}
    predicted: dict[tuple[int, str, float], float] = {}
    cells = [(rate, cap) for rate in args.rates for cap in args.caps]
    for ranks in args.ranks:
        rng.shuffle(cells)
        head = [(f"profile:{cap0:g}", RATES[rate0]), ("sweep", RATES[args.swept])] if ranks == ranks0 else []
        t0, folder = time.monotonic(), os.path.join(work, f"r{ranks}")
        if args.repredict:  # a kept round: its cells in the order they ran (a folder kept before cells.json: the same shuffle)
            if os.path.exists(os.path.join(folder, "cells.json")):
                with open(os.path.join(folder, "cells.json")) as f:
                    cells = [(rate, float(cap)) for rate, cap in json.load(f)]
            with open(os.path.join(folder, "results.json")) as f:
                out = json.load(f)
        else:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "cells.json"), "w") as f:
                json.dump(cells, f)
            out = launch(ranks, head + [(f"train:{cap:g}", RATES[rate]) for rate, cap in cells], args, folder)
        if head:
            run_dir, sweep = os.path.join(work, f"r{ranks}", "run"), out[1]
        for (rate, cap), ts in zip(cells, out[len(head):]):
            measured[(ranks, rate, cap)] = [t * 1e3 for t in ts]
        print(f"  {len(cells)} cells on {ranks} ranks in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    predicted, intervals, replay_ms = predict(run_dir, args.profiled, sweep, args.swept, sorted(measured), args.cores, raw=True,
                                              calibrated=args.calibrated)
    predicted["replay"] = replay_ms
    corrected, corrected_intervals, cost = predict(run_dir, args.profiled, sweep, args.swept, sorted(measured), args.cores,
                                                   calibrated=args.calibrated)
    predicted |= {("corrected", *key): v for key, v in corrected.items()}
    intervals |= {("corrected", *key): v for key, v in corrected_intervals.items()}
    print(f"  {cost}", file=sys.stderr)
    predicted["cost"] = cost
    return measured, predicted, intervals


def predict(run_dir: str, profiled: tuple, sweep: list, swept: str, cells: list[tuple[int, str, float]], cores: int,
            raw: bool = False, calibrated: dict[tuple[int, str], str] | None = None) -> tuple[dict, dict, float | str]:
    """Every cell from the one profile: the link of the profiled rate is fitted to the profile's
    collectives, the swept link to the sweep; another shaped rate scales the bandwidth of
    whichever of the two is shaped (so TCP/IP framing overhead carries over). The point is the
    averaged iteration's; its interval comes from the same cell replayed step by step, with the
    uncertainty of the link it is priced on: the profiled collectives' scatter about their fit, or for
    a cell on the swept link the sweep's own about its fit at the sizes DDP's buckets have (>= 1 MB,
    as ``fit_sweep``'s bandwidth; the profiled link's scatter says nothing about another link). Unless
    ``raw``, the profiler's cost measured on the profile (its window against the unprofiled steps
    after it) is removed from the op times first, as ``dagprof whatif`` does, and the third value
    is the line saying so instead of the replayed iteration. ``calibrated``: per (ranks, link), a ``dagprof calibrate
    [--overlap]`` file measured on that link with that many ranks. Compute slowed beside in-flight collectives
    (measured on the run, else in the file of the cell's ranks and link, else of the profiled ranks on its link, else
    of the profiled cell) is priced as ``dagprof whatif`` prices it: taken out of the profiled op times (``undisturb``,
    by the profiled cell's file), charged again under each cell (``disturb``), each collective by its bytes per second
    against the all-reduce its file measured beside. One file per link, because on this testbed the slowdown does not
    follow the bytes per second: beside an 8 MiB all-reduce it measured about 0.22 at 1 Gbit/s, 0.47 at 200 Mbit/s
    and 0.47 unshaped (40x the bytes per second of 200 Mbit/s). A file of the swept link at a rank count the rounds did
    not sweep prices that count's swept cells by its all-reduce fit, in place of ``beta * ranks / cores``."""
    import numpy as np

    from dagprof.analysis import job_iteration_us
    from dagprof.analysis.interval import (
        StepStatistic,
        cost_factors,
        link_residuals,
        measured_step_us,
        predict_interval,
        run_level,
    )
    from dagprof.collect.measure.calibrate import fit
    from dagprof.costmodel.alphabeta import AlphaBeta, ring_allreduce_us
    from dagprof.costmodel.topology import Topology, read_link_model
    from dagprof.passes import fit_topology, scale_workers, set_buckets, set_topology
    from dagprof.passes.average_steps import average_steps
    from dagprof.passes.compute import share_cores
    from dagprof.passes.overlap import core_bound_slowdown
    from dagprof.passes.profiler_cost import correct_profiler_cost, measure_profiler_cost, scale_host_work
    from dagprof.pipeline import open_run
    from dagprof.replay import replay
    from dagprof.search.measured import slowdown_of
    from dagprof.search.scenario import Cluster, disturb, undisturb
    from dagprof.search.shared_cores import comm_slowdown_beside, unslowed_profile, with_shared_cores
    from dagprof.units import MB

    prof = open_run(run_dir)
    stepwise = prof.graph
    calibrated = calibrated or {}

    def measured(path: str | None) -> Cluster:
        slowdown, rate = slowdown_of(prof.run, path)
        return Cluster(slowdown=slowdown, comm_rate=rate)

    beside = {key: measured(path) for key, path in calibrated.items()}
    beside0 = beside[profiled[:2]] if profiled[:2] in beside else measured(None)
    averaged = average_steps(stepwise, replay)  # a model of the iteration: each op at its mean over the profiled steps
    prof_ranks, prof_rate, _ = profiled
    links = {prof_rate: fit_topology(averaged).inter, swept: fit([tuple(x) for x in sweep], 2)}
    shaped = prof_rate if RATES[prof_rate] else swept
    base_topo = Topology.flat(prof_ranks, links[prof_rate])
    cost = measure_profiler_cost(stepwise)
    measured_us, profiled, host = measured_step_us(stepwise, StepStatistic.MEAN)[0], stepwise, (1.0, 1.0)
    if not raw:
        built = averaged
        fix = correct_profiler_cost(built, cost, job_iteration_us, model=set_topology(built, base_topo), measured=stepwise,
                                    pace_after_window=False)  # as whatif: the window's compute pace
        said = fix.describe(built, cost)
        averaged = fix.graph
        host = cost_factors(built, cost, fix.factor, job_iteration_us, model=set_topology(built, base_topo))
        stepwise = scale_host_work(stepwise, fix.factor)
        measured_us *= 1.0 - fix.share
    as_built_ms = job_iteration_us(averaged) / 1e3
    averaged = undisturb(averaged, set_topology(averaged, base_topo), beside0)
    stepwise = undisturb(stepwise, set_topology(stepwise, base_topo), beside0)
    residuals = link_residuals(stepwise, set_topology(stepwise, base_topo))
    swept_m, swept_t = np.array(sweep, dtype=float).T
    big = swept_m >= MB
    swept_residuals = swept_t[big] / ring_allreduce_us(swept_m[big], 2, links[swept])
    level = run_level(profiled, cost, not raw, job_iteration_us(*disturb(set_topology(averaged, base_topo), beside0)), measured_us, host)  # as whatif's
    out, intervals = {}, {}
    for ranks, rate, cap in cells:
        link = links.get(rate)
        if link is None:
            if RATES[shaped] is None or RATES[rate] is None:
                raise ValueError(f"no measurement covers the link {rate}")
            link = links[shaped].from_bandwidth(links[shaped].bandwidth_bytes_per_s * RATES[rate] / RATES[shaped], links[shaped].alpha_us)
        if rate == swept and ranks != prof_ranks and (ranks, rate) in calibrated:  # this rank count's own sweep of the link
            link = read_link_model(calibrated[(ranks, rate)]).link_for(ranks)
        elif RATES[rate] is None and ranks > cores:  # an unshaped link is CPU work: 'ranks' copiers share 'cores'
            link = AlphaBeta(link.alpha_us, link.beta_us_per_byte * ranks / cores)

        def cell(g0):
            g = set_topology(g0, base_topo)
            g = scale_workers(g, ranks, replicate=True) if ranks != prof_ranks else g
            g = set_topology(g, Topology.flat(ranks, link))
            g = set_buckets(g, cap * 2**20)
            return share_cores(g, cores) if ranks > cores else g

        at = beside.get((ranks, rate)) or beside.get((prof_ranks, rate)) or beside0
        point = job_iteration_us(*disturb(cell(averaged), at))
        g, res = disturb(cell(stepwise), at)
        out[(ranks, rate, cap)] = point / 1e3
        iv = predict_interval(g, res, point, swept_residuals if rate == swept else residuals, run=level)
        if RATES[rate] is None:  # loopback: the all-reduces are the ranks' own CPU work, priced by a sweep timed alone, beside
            # nothing (``search.shared_cores``, as whatif applies it): up to the cores' bound slower beside the cell's compute
            # (or the cell's calibrate file's comm_slowdown), and that compute beside them where the point priced none; and,
            # where the profiled link's slowdown was not measured, the profile's compute run beside nothing
            comm = comm_slowdown_beside(prof.graph, calibrated.get((ranks, rate)) or calibrated.get((prof_ranks, rate)))
            unslowed = None if beside0.slowdown else cell(unslowed_profile(stepwise, set_topology(stepwise, base_topo), prof.graph))
            iv = with_shared_cores(iv, g, res, comm, 0.0 if at.slowdown else core_bound_slowdown(prof.graph), unslowed)
        intervals[(ranks, rate, cap)] = iv
    return out, intervals, as_built_ms if raw else said


def calibrated(spec: str, ap: argparse.ArgumentParser) -> tuple[tuple[int, str], str]:
    """``LINK:FILE`` as ((ranks the file was measured with, LINK), FILE)."""
    link, _, path = spec.partition(":")
    if link not in RATES or not path:
        ap.error(f"--calibrated takes LINK:FILE with LINK one of {', '.join(RATES)}, got {spec!r}")
    with open(path) as f:
        return (int(json.load(f)["workers"]), link), path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round, 2 ranks, 1Gbit + 200Mbit, 1 and 25 MB")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of profile + sweep + all cells (cells shuffled in each; default 3, --quick 1)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per cell and round")
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--profile-margin", type=int, default=3, help="unprofiled steps before the profiled window (after the warm-up): "
                    "with the timed steps after it, they measure the job's drift across the window (analysis.interval.run_level)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--profiled-link", choices=list(RATES), default=PROFILED[1], help="link rate of the profiled cell")
    ap.add_argument("--swept-link", choices=list(RATES), default=SWEPT, help="link rate the all-reduce sweep calibrates")
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    ap.add_argument("--keep", default=None, help="keep profiles, sweeps and logs in this folder")
    ap.add_argument("--repredict", default=None, metavar="KEPT", help="run nothing: predict the rounds a --keep folder holds again, "
                    "with this dagprof, against the steps they measured (same grid options as the run that kept them)")
    ap.add_argument("--calibrated", nargs="+", default=[], metavar="LINK:FILE", help="dagprof calibrate [--overlap] files, each "
                    "measured on LINK (one of the rates) with its workers' ranks: the compute slowdown beside in-flight collectives "
                    "of those cells (as whatif --link-model prices it), and on the swept link at a rank count the rounds did not "
                    "sweep, its all-reduce")
    args = ap.parse_args()
    args.calibrated = dict(calibrated(spec, ap) for spec in args.calibrated)
    args.profiled = (PROFILED[0], args.profiled_link, PROFILED[2])
    args.swept = args.swept_link
    if args.profiled_link == args.swept_link:
        ap.error("profile and sweep must measure different links")
    why = None if args.repredict else available()
    if why:
        print(f"testbed: skipped: {why}", file=sys.stderr)
        return 0
    kept = sum(1 for d in os.listdir(args.repredict) if d.isdigit()) if args.repredict else 0
    args.rounds = args.rounds or kept or (1 if args.quick else 3)
    args.ranks = [2] if args.quick else [2, 4]
    args.rates = ["1Gbit", "200Mbit"] if args.quick else list(RATES)
    args.caps = (1.0, 25.0) if args.quick else CAPS_MB
    t0 = time.monotonic()
    steps: dict[tuple[int, str, float], list[float]] = {}
    preds: dict = {}
    round_means: dict[tuple[int, str, float], list[float]] = {}  # per round: the cell's mean timed step, ms
    # per flavour (raw, corrected) and link: [timed steps inside the round's 90 % interval, below it, above it, timed steps]
    inside_steps: dict[str, dict[str, list[int]]] = {"raw": {}, "corrected": {}}
    medians_inside: dict[str, list[bool]] = {"raw": [], "corrected": []}  # per (round, cell): the round's median step inside
    bounds: dict[tuple, list] = {}  # per flavour and cell, per round: [lo ms, hi ms, timed steps below, above]
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="dagprof-testbed-") as tmp:
        work = args.repredict or args.keep or tmp
        for k in range(args.rounds):
            print(f"round {k + 1}/{args.rounds}", file=sys.stderr)
            m, p, iv = one_round(args, os.path.join(work, str(k)), rng)
            for key, v in m.items():
                steps.setdefault(key, []).extend(v)
                round_means.setdefault(key, []).append(statistics.mean(v))
                for flavour, ivk in (("raw", iv[key]), ("corrected", iv[("corrected", *key)])):
                    below, above = sum(t * 1e3 < ivk.lo_us for t in v), sum(t * 1e3 > ivk.hi_us for t in v)
                    tally = inside_steps[flavour].setdefault(key[1], [0, 0, 0, 0])
                    for i, x in enumerate((len(v) - below - above, below, above, len(v))):
                        tally[i] += x
                    medians_inside[flavour].append(ivk.contains(statistics.median(v) * 1e3))
                    bounds.setdefault((flavour, *key), []).append([ivk.lo_us / 1e3, ivk.hi_us / 1e3, below, above])
            for key, v in p.items():
                preds.setdefault(key, []).append(v)
    rows = []
    print(f"profiled cell: {args.profiled[0]} ranks, {args.profiled[1]}, {args.profiled[2]:g} MB buckets, once per round; "
          f"{args.rounds} round(s), medians over rounds (predicted) and over all timed steps (measured)")
    for k, line in enumerate(preds["cost"]):
        print(f"round {k + 1}: {line}")
    print("raw: from the op times as profiled (--raw); corrected: the profiler's cost removed first (dagprof's default); "
          "spread: per-round error, lowest to highest (each round's prediction against that round's mean step)")
    print(f"{'ranks':>5} {'link':>9} {'bucket MB':>9} {'measured ms':>12} {'raw ms':>8} {'error %':>8} {'spread':>13} "
          f"{'corrected ms':>13} {'error %':>8} {'spread':>13}")
    for key in sorted(steps):
        m, pr, pc = statistics.median(steps[key]), statistics.median(preds[key]), statistics.median(preds[("corrected", *key)])
        err, errc = 100.0 * (pr - m) / m, 100.0 * (pc - m) / m
        spreads = [sorted(100.0 * (p - rm) / rm for p, rm in zip(preds[k], round_means[key])) for k in (key, ("corrected", *key))]
        rows.append({"ranks": key[0], "link": key[1], "bucket_mb": key[2], "measured_ms": m, "predicted_ms": pc, "error_pct": errc,
                     "raw_predicted_ms": pr, "raw_error_pct": err, "per_round_predicted_ms": preds[("corrected", *key)],
                     "per_round_raw_predicted_ms": preds[key], "per_round_measured_ms": round_means[key],
                     "per_round_interval_ms": bounds[("corrected", *key)], "per_round_raw_interval_ms": bounds[("raw", *key)],
                     "steps_ms": steps[key]})
        mark = "  (profiled)" if key == args.profiled else ""
        sp = [f"{s[0]:+.1f}..{s[-1]:+.1f}" for s in spreads]
        print(f"{key[0]:>5} {key[1]:>9} {key[2]:>9g} {m:>12.1f} {pr:>8.1f} {err:>+8.1f} {sp[0]:>13} {pc:>13.1f} {errc:>+8.1f} {sp[1]:>13}{mark}")
    fixed = [k for k, line in enumerate(preds["cost"]) if line.startswith("op times corrected")]
    if fixed:  # paired: the same round's prediction with and without the correction, against that round's measurement
        pairs = [(100.0 * (preds[key][k] - round_means[key][k]) / round_means[key][k],
                  100.0 * (preds[("corrected", *key)][k] - round_means[key][k]) / round_means[key][k], key) for k in fixed for key in sorted(steps)]
        for link in args.rates:
            got = [(a, b) for a, b, key in pairs if key[1] == link]
            if got:
                print(f"rounds the correction applied to ({len(fixed)} of {args.rounds}), {link} cells: mean |error| raw "
                      f"{statistics.mean(abs(a) for a, _ in got):.1f} %, corrected {statistics.mean(abs(b) for _, b in got):.1f} %; "
                      f"moved toward the measurement in {sum(abs(b) < abs(a) for a, b in got)} of {len(got)} (round, cell) pairs")
    else:
        print("the correction applied to no round (each says why above): raw and corrected agree")
    groups = {
        "bandwidth what-ifs (2 ranks, other link rate)": [r for r in rows if r["ranks"] == args.profiled[0] and r["link"] != args.profiled[1]],
        f"bucket-size what-ifs (2 ranks, {args.profiled[1]}, other bucket)": [
            r for r in rows if r["ranks"] == args.profiled[0] and r["link"] == args.profiled[1] and r["bucket_mb"] != args.profiled[2]],
        "2 -> 4 workers": [r for r in rows if r["ranks"] != args.profiled[0]],
    }
    for name, rs in groups.items():
        if rs:
            print(f"median |error| {name}: raw {statistics.median(abs(r['raw_error_pct']) for r in rs):.1f} %, corrected "
                  f"{statistics.median(abs(r['error_pct']) for r in rs):.1f} % over {len(rs)} cells")
    for flavour, tallies in inside_steps.items():
        if tallies:
            hit, below, above, n = (sum(t[i] for t in tallies.values()) for i in range(4))
            by_link = ", ".join(f"{link} {t[0]} of {t[3]} ({100 * t[0] / t[3]:.0f} %)" for link, t in sorted(tallies.items()))
            medians = medians_inside[flavour]
            print(f"90 % intervals, {flavour} (each round's own profile, its cells' steps replayed one by one, widened by "
                  f"the run's level): per-round cell medians inside {sum(medians)} of {len(medians)} ({100 * sum(medians) / len(medians):.0f} %); "
                  f"single steps (wider than a median) {hit} of {n} ({100 * hit / n:.0f} %; {by_link}; {below} below, {above} above)")
    print(f"replay of the profiled graph as built (measured spans, no what-if): {statistics.median(preds['replay']):.1f} ms/iter")
    print(f"testbed wall time {time.monotonic() - t0:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
