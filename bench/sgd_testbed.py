"""``bench_sgd.py --testbed``: the S-SGD DAG model (``dagprof sgd``) against real DDP jobs on the namespace testbed.

See bench_sgd.py's docstring for the design. Per round: the job profiled on one rank, then per rank
count one job that sweeps the all-reduce on each link rate and runs every (policy, rate) cell,
shuffled. Every prediction is ``dagprof sgd`` (in process, ``--json``) on the round's run folder,
or on a layer CSV of the same profile with compute scaled for the ranks sharing this machine's cores.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "testbed"))

RATES = {"200Mbit": 200e6, "1Gbit": 1e9}
POLICIES = {"wfbp": 1e-6, "fused": 1000.0}  # DDP bucket_cap_mb: 1 byte (one bucket per parameter = per layer), one bucket
RANKS = (2, 4)
# the job: 8 bias-free Linear layers of 0.26-0.98 MB (5.5 MB of fp32 gradients), batch 256: on one core the
# backward (~2/3 of compute) is comparable to the 1 Gbit/s all-reduce, and the 200 Mbit/s one is several times it
JOB = argparse.Namespace(width=384, depth=8, batch=256, warmup=3, steps=8, profile_steps=8, profile_margin=3)
EXTRA = ("--no-bias",)
# the overlap measurement (dagprof calibrate --overlap's) beside an all-reduce of the job's mean per-layer gradient (5.28 MiB over
# 8 layers): the size of WFBP's all-reduces that overlap the backward; the slowdowns depend on it (see collect.measure.overlap)
OVERLAP_MB = 0.66
JITTER = 64  # --jitter samples
COMPUTE = ("plain", "+cores", "+cores-contention", "plain+jitter", "+cores+jitter", "+cores+jitter-contention")
# fixed before any measurement: the variant the mean |error| is quoted for (rounds kept before the backward's overlap was
# measured: its calibrate-loop variant)
HEADLINE = ("calibrate-bwd", "+cores", "unprofiled")


def run_round(folder: str, rng: random.Random, repredict: bool, overlap_from: str | None = None) -> dict:
    """Profile on one rank, then per rank count the sweeps, the overlap measurements and every cell; returns what the round
    measured. ``overlap_from``: a kept round without overlap measurements takes ``measure_overlap``'s from there."""
    from run import launch

    from dagprof.collect.measure.calibrate import fit
    from dagprof.costmodel.topology import save_link_model

    load = [os.getloadavg()[0]]
    r1 = os.path.join(folder, "r1")
    if repredict:
        with open(os.path.join(r1, "results.json")) as f:
            profile_steps = json.load(f)[0]
    else:
        profile_steps = launch(1, [("profile:1000", None)], JOB, r1, extra=EXTRA)[0]
    unprofiled = profile_steps[:JOB.profile_margin] + profile_steps[JOB.profile_margin + JOB.profile_steps:]
    measured: dict[tuple[int, str, str], float] = {}  # mean step, ms (dagprof's iteration time)
    medians: dict[tuple[int, str, str], float] = {}
    fastest: dict[tuple[int, str, str], float] = {}
    links: dict[tuple[str, int, str], str] = {}  # (comm source, ranks, rate): link file
    for ranks in RANKS:
        control = os.path.join(folder, f"r{ranks}")
        if repredict:
            with open(os.path.join(control, "cells.json")) as f:
                cells = [tuple(c) for c in json.load(f)]
            with open(os.path.join(control, "results.json")) as f:
                out = json.load(f)
        else:
            cells = [(p, r) for p in POLICIES for r in RATES]
            rng.shuffle(cells)
            os.makedirs(control, exist_ok=True)
            with open(os.path.join(control, "cells.json"), "w") as f:
                json.dump(cells, f)
            t0 = time.monotonic()
            out = launch(ranks, [(f"{phase}", rate) for phase in ("sweep", f"overlap:{OVERLAP_MB}", f"overlapbwd:{OVERLAP_MB}") for rate in RATES.values()]
                         + [(f"train:{POLICIES[p]:g}", RATES[r]) for p, r in cells], JOB, control, extra=EXTRA)
            print(f"  {ranks} ranks: sweeps, overlaps + {len(cells)} cells in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        # per link: the sweep, then (rounds kept before them have none: their link files carry no contention) the overlap
        # beside calibrate --overlap's matrix loop, then beside the job's own backward
        phases = [out[k:k + len(RATES)] for k in range(0, len(out) - len(cells), len(RATES))]
        sweeps, overlaps, backward = (phases + [[None] * len(RATES)] * 2)[:3]
        if overlap_from and overlaps[0] is None:
            with open(os.path.join(overlap_from, f"r{ranks}", "results.json")) as f:
                overlaps = json.load(f)
        for source, beside, suffix in (("calibrate", overlaps, ""), ("calibrate-bwd", backward, "-backward")):
            if source != "calibrate" and beside[0] is None:
                continue
            for rate, points, overlap in zip(RATES, sweeps, beside):  # in dagprof calibrate's format: what `dagprof sgd --link-model` reads
                links[source, ranks, rate] = save_link_model(
                    os.path.join(control, f"link-{rate}{suffix}.json"), fit([tuple(p) for p in points], ranks), backend="gloo", workers=ranks,
                    points=points, overlap=overlap, method="live sweep on the testbed link (bench_sgd --testbed), ring alpha-beta fit"
                    + (f"; overlap: dagprof calibrate --overlap's measurement on the same ranks and link, beside {overlap.get('beside', 'matmul')}"
                       if overlap else ""))
        for (policy, rate), steps in zip(cells, out[len(out) - len(cells):]):
            measured[ranks, rate, policy] = 1e3 * statistics.mean(steps)
            medians[ranks, rate, policy] = 1e3 * statistics.median(steps)
            fastest[ranks, rate, policy] = 1e3 * min(steps)
    load.append(os.getloadavg()[0])
    return {"run": os.path.join(r1, "run"), "iter_1_profiled_ms": None, "iter_1_unprofiled_ms": 1e3 * statistics.mean(unprofiled),
            "measured": measured, "measured_median": medians, "measured_fastest": fastest, "links": links, "load": load}


def sgd(*argv: str) -> dict:
    """``dagprof sgd ARGV --json``, in process."""
    from dagprof.cli.main import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["sgd", *argv, "--json"])
    if rc:
        raise SystemExit(f"dagprof sgd {' '.join(argv)} exited {rc}")
    return json.loads(buf.getvalue())


def scaled(run: str, factor: float, iter_1_us: float | None):
    """The run folder's layer profile, anchored as ``dagprof sgd`` anchors it, with every compute time times ``factor``."""
    from dagprof.sgd import anchor_single_worker
    from dagprof.traces.layerwise import read_layer_file

    p, _ = anchor_single_worker(read_layer_file(run), iter_1_us, [])
    return p.with_(forward_us=p.forward_us * factor, backward_us=p.backward_us * factor, update_us=p.update_us * factor,
                   io_us=p.io_us * factor, h2d_us=p.h2d_us * factor, step_forward_us=p.step_forward_us * factor,
                   step_backward_us=p.step_backward_us * factor, step_update_us=p.step_update_us * factor)


def as_csv(profile, path: str) -> str:
    """A layer CSV of ``profile`` (what ``dagprof sgd`` reads; per-step tables are a run folder's only)."""
    rows = [f"# io_us={profile.io_us}, h2d_us={profile.h2d_us}, update_us={profile.update_us}", "layer,forward_us,backward_us,grad_bytes"]
    rows += [f"{n},{f},{b},{g}" for n, f, b, g in zip(profile.names, profile.forward_us, profile.backward_us, profile.grad_bytes)]
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")
    return path


def predict_round(rnd: dict, cores: int, tmp: str, jitter: int = JITTER) -> dict:
    """Predicted ms per (comm source, compute, anchor, ranks, rate, policy).

    compute: ``plain`` is ``dagprof sgd`` on the run folder; ``+cores`` on a layer CSV of the same profile with
    compute scaled by ranks/cores; ``+jitter`` adds ``--jitter`` (on the run folder; scaled, through the library
    ``dagprof sgd`` calls, since a CSV has no per-step tables). No ``unprofiled`` rows where ``dagprof sgd`` refuses that anchor
    (``refused_anchor``)."""
    from dagprof.sgd import Policy, comm_model, predict

    out: dict[tuple, float] = {}
    first = sgd(rnd["run"], "--workers", "1")
    rnd["iter_1_profiled_ms"] = 1e3 * first["iter_time_1_s"]
    for anchor in ("profiled",) + (() if refused_anchor(rnd) else ("unprofiled",)):  # the bench skips a refused round whole
        iter_1_us = None if anchor == "profiled" else rnd["iter_1_unprofiled_ms"] * 1e3
        iter_1 = [] if iter_1_us is None else ["--iter-time-1", f"{iter_1_us / 1e6:.9f}"]
        for rate in RATES:
            for source in ("net", *sorted({k[0] for k in rnd["links"]})):
                files = [rnd["links"][source, n, rate] for n in RANKS] if source != "net" else []
                comm = ["--net", rate] if source == "net" else [a for f in files for a in ("--link-model", f)]
                workers = ",".join(map(str, RANKS))
                plain = {"plain": sgd(rnd["run"], "--workers", workers, *comm, *iter_1),
                         "plain+jitter": sgd(rnd["run"], "--workers", workers, *comm, *iter_1, "--jitter", str(jitter))}
                for ranks in RANKS:
                    factor = max(1.0, ranks / cores)
                    profile = scaled(rnd["run"], factor, iter_1_us)
                    csv = as_csv(profile, os.path.join(tmp, "layers.csv"))
                    shared = {"+cores": sgd(csv, "--workers", str(ranks), *comm),
                              "+cores-contention": sgd(csv, "--workers", str(ranks), *comm, "--no-contention")}
                    model = comm_model(profile, rate if source == "net" else None, link_models=[] if source == "net" else files)
                    jittered = {c: predict(profile, [ranks], model, jitter_samples=jitter, contention=on).table
                                for c, on in (("+cores+jitter", True), ("+cores+jitter-contention", False))}
                    for policy in POLICIES:
                        for compute, r in (*plain.items(), *shared.items()):
                            row = next(x for x in r["policies"][policy] if x["workers"] == ranks)
                            out[source, compute, anchor, ranks, rate, policy] = 1e3 * row["iter_time_s"]
                        for compute, table in jittered.items():
                            out[source, compute, anchor, ranks, rate, policy] = table[Policy(policy)][0].iter_us / 1e3
    return out


def refused_anchor(rnd: dict) -> str | None:
    """Why ``dagprof sgd`` refuses the round's unprofiled anchor (``sgd.anchor``: a one-rank step no longer than the profile's
    compute, beyond the profiler's cost), or None: such a round has no ``unprofiled`` rows, so it is skipped whole."""
    from dagprof.errors import DagprofError

    try:
        scaled(rnd["run"], 1.0, rnd["iter_1_unprofiled_ms"] * 1e3)
    except DagprofError as e:
        return e.problem
    return None


def parts_round(rnd: dict, cores: int) -> dict:
    """Where the headline's step goes, per cell: (compute, all-reduces) ms, the one-worker compute (forward + backward +
    update, the anchor's serial rest included) scaled as the ``+cores`` rows scale it, and the all-reduces as the
    round's link file prices the policy's messages (one of every gradient's bytes for fused, one per layer for WFBP).
    Anchored on the unprofiled one-rank step, or on the profiled one where ``dagprof sgd`` refuses that anchor."""
    from dagprof.sgd import Policy, comm_model, make_schedule

    out = {}
    iter_1_ms = rnd["iter_1_profiled_ms" if refused_anchor(rnd) else "iter_1_unprofiled_ms"]
    for ranks in RANKS:
        profile = scaled(rnd["run"], max(1.0, ranks / cores), iter_1_ms * 1e3)
        compute = float(profile.forward_or_zero().sum() + profile.backward_us.sum() + profile.update_us) / 1e3
        for rate in RATES:
            model = comm_model(profile, link_models=[rnd["links"]["calibrate", ranks, rate]])
            for policy in POLICIES:
                out[ranks, rate, policy] = (compute, float(make_schedule(profile, Policy(policy), ranks, model).comm_us.sum()) / 1e3)
    return out


def testbed(args) -> int:
    from dagprof.collect.jobs.netns import available

    why = None if args.repredict else available()
    if why:
        print(f"bench_sgd --testbed: skipped: the emulated cluster {why}", file=sys.stderr)
        return 0
    if args.measure_overlap:
        return measure_overlap(args.measure_overlap)
    rounds = sum(1 for d in os.listdir(args.repredict) if d.isdigit()) if args.repredict else args.rounds
    rng = random.Random(0)
    t0 = time.monotonic()
    done, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="dagprof-bench-sgd-") as tmp:
        work = args.repredict or args.keep or tmp
        for k in range(rounds):
            print(f"round {k + 1}/{rounds}", file=sys.stderr)
            rnd = run_round(os.path.join(work, str(k)), rng, bool(args.repredict), args.overlap_from)
            why = refused_anchor(rnd)
            if why:
                skipped.append(f"round {k + 1}: {why}")
                print(f"  skipped: {why}", file=sys.stderr)
                continue
            rnd["predicted"] = predict_round(rnd, args.cores, tmp)
            rnd["parts"] = parts_round(rnd, args.cores)
            done.append(rnd)
    if skipped:
        print(f"{len(skipped)} of {rounds} round(s) skipped: dagprof sgd refuses to anchor a profile on a one-rank iteration shorter "
              "than its compute (the unprofiled steps ran faster than the profile's ops by more than the profiler's cost)\n  "
              + "\n  ".join(skipped))
    if not done:
        print("no round left to report")
        return 1
    report(done, args, skipped)
    print(f"bench wall time {time.monotonic() - t0:.0f} s")
    return 0


def measure_overlap(folder: str) -> int:
    """Only the overlap measurements of a round (per rank count, on each link), kept in ``folder`` for ``--overlap-from``."""
    from run import launch

    load = [os.getloadavg()[0]]
    for ranks in RANKS:
        out = launch(ranks, [(f"overlap:{OVERLAP_MB}", rate) for rate in RATES.values()], JOB, os.path.join(folder, f"r{ranks}"), extra=EXTRA)
        for rate, o in zip(RATES, out):
            print(f"{ranks} ranks {rate:>8}: beside a {OVERLAP_MB} MiB all-reduce, compute x(1 + {o['slowdown']:.2f} f), "
                  f"the all-reduce x(1 + {o['comm_slowdown']:.2f} f)")
    load.append(os.getloadavg()[0])
    print(f"load average (1 min) {min(load):.1f}-{max(load):.1f}")
    return 0


def overlap_of(link: str):
    """The overlap a round's link file holds (None: none measured)."""
    from dagprof.collect.measure.overlap import overlap_from_table
    from dagprof.costmodel.topology import read_link_model

    table = read_link_model(link).overlap
    return None if table is None else overlap_from_table(table, link)


def report(done: list[dict], args, skipped: list[str]) -> None:
    headline = HEADLINE
    if any(("calibrate-bwd", RANKS[0], next(iter(RATES))) not in r["links"] for r in done):
        headline = ("calibrate", *HEADLINE[1:])
        print("rounds without the overlap measured beside the job's backward: the headline prices contention by the matrix loop's")
    cells = [(n, rate, p) for n in RANKS for rate in RATES for p in POLICIES]
    loads = [x for r in done for x in r["load"]]
    print(f"S-SGD DAG model (dagprof sgd) against real gloo DDP jobs on the namespace testbed: {len(done)} round(s), "
          f"{JOB.depth} bias-free Linear layers, batch {JOB.batch}, ranks on {args.cores} cores; load average (1 min) "
          f"{min(loads):.1f}-{max(loads):.1f} over the rounds (the machine is shared: figures under load are indicative)")
    print("single-rank iteration (ms) per round: profiled " + ", ".join(f"{r['iter_1_profiled_ms']:.1f}" for r in done)
          + "; unprofiled " + ", ".join(f"{r['iter_1_unprofiled_ms']:.1f}" for r in done))

    def err(variant: tuple, cell: tuple) -> list[float]:
        return [100 * (r["predicted"][(*variant, *cell)] / r["measured"][cell] - 1) for r in done]

    print(f"\nheadline ({', '.join(headline)}; fixed before measuring): predicted vs measured mean step, ms (median over rounds; "
          "error: median of the rounds' own errors)")
    print(f"{'ranks':>5} {'link':>8} {'policy':>6} {'measured':>9} {'rounds':>15} {'predicted':>9} {'error':>7}")
    for cell in cells:
        m = [r["measured"][cell] for r in done]
        p = [r["predicted"][(*headline, *cell)] for r in done]
        print(f"{cell[0]:>5} {cell[1]:>8} {cell[2]:>6} {statistics.median(m):>9.1f} {min(m):>7.1f}-{max(m):<7.1f} {statistics.median(p):>9.1f} "
              f"{statistics.median(err(headline, cell)):>+6.1f}%")
    sources = sorted({k[0] for r in done for k in r["predicted"]}, key=("net", "calibrate", "calibrate-bwd").index)
    # without contention a link file's overlap is unused: the -contention rows are calibrate's only
    variants = [(s, c, a) for s in sources for c in COMPUTE for a in ("profiled", "unprofiled") if s == "calibrate" or "contention" not in c]
    table = {}
    print("\nablation: mean |error| over cells (each cell: median of its rounds' errors), %")
    print(f"{'comm source':>11} {'compute':>24} {'anchor':>10} {'all':>6} " + " ".join(f"{p:>6}" for p in POLICIES)
          + " " + " ".join(f"{f'{n}r {rate}':>11}" for n in RANKS for rate in RATES))
    for v in variants:
        e = {cell: statistics.median(err(v, cell)) for cell in cells}
        table[v] = e

        def mean_abs(keep) -> float:
            return statistics.mean(abs(x) for c, x in e.items() if keep(c))

        cols = [mean_abs(lambda c: True)] + [mean_abs(lambda c, p=p: c[2] == p) for p in POLICIES]
        cols += [mean_abs(lambda c, n=n, rate=rate: c[:2] == (n, rate)) for n in RANKS for rate in RATES]
        mark = "  <- headline" if v == headline else ""
        print(f"{v[0]:>11} {v[1]:>24} {v[2]:>10} " + " ".join(f"{x:>6.1f}" for x in cols[:3]) + " " + " ".join(f"{x:>11.1f}" for x in cols[3:]) + mark)
    print("comm source: net = --net RATE (ring, no latency); calibrate = --link-model of a sweep on that link and rank count, its\n"
          "  contention measured beside calibrate --overlap's matrix loop; calibrate-bwd = the same sweep, its contention measured\n"
          "  beside the job's own backward.\n"
          "compute: +cores scales it by ranks/cores; +jitter: dagprof sgd --jitter (workers draw profiled steps); where the link file\n"
          "  holds the round's overlap measurement, compute and all-reduces slow each other as measured (-contention: --no-contention).\n"
          "anchor: the single-rank iteration the serial rest comes from (the profiled steps', or the unprofiled ones').")
    med = statistics.mean(abs(statistics.median(100 * (r["predicted"][(*headline, *c)] / r["measured_median"][c] - 1) for r in done)) for c in cells)
    print(f"headline against each cell's MEDIAN step (the sweep's statistic) instead of its mean: mean |error| {med:.1f} %")
    print("\ncontention measured (median over rounds; compute x(1 + c f) beside an all-reduce, the all-reduce x(1 + a f) beside compute)")
    for n in RANKS:
        for rate in RATES:
            row = []
            for source in sources[1:]:
                o = [overlap_of(r["links"][source, n, rate]) for r in done]
                if all(o):
                    row.append(f"{o[0].beside}: c {statistics.median(x.model_slowdown for x in o):.2f} a {statistics.median(x.comm_slowdown for x in o):.2f}")
            print(f"  {n} ranks {rate:>8}: " + "; ".join(row))
    print("\nwhere the step goes (headline; ms, median over rounds): the step beyond compute, measured against priced")
    print(f"{'ranks':>5} {'link':>8} {'policy':>6} {'mean':>7} {'median':>7} {'fastest':>7} {'compute':>7} {'all-red.':>8} "
          f"{'meas-comp':>9} {'pred-comp':>9} {'loop':>6} {'no cont.':>8} {'unpriced':>8}")
    nocont = (headline[0], "+cores-contention", headline[2])
    for cell in cells:
        def med(f) -> float:
            return statistics.median(f(r) for r in done)

        comp = med(lambda r: r["parts"][cell][0])
        print(f"{cell[0]:>5} {cell[1]:>8} {cell[2]:>6} {med(lambda r: r['measured'][cell]):>7.1f} {med(lambda r: r['measured_median'][cell]):>7.1f} "
              f"{med(lambda r: r['measured_fastest'][cell]):>7.1f} {comp:>7.1f} {med(lambda r: r['parts'][cell][1]):>8.1f} "
              f"{med(lambda r: r['measured'][cell] - r['parts'][cell][0]):>9.1f} "
              f"{med(lambda r: r['predicted'][(*headline, *cell)] - r['parts'][cell][0]):>9.1f} "
              f"{med(lambda r: r['predicted'][('calibrate', *headline[1:], *cell)] - r['parts'][cell][0]):>6.1f} "
              f"{med(lambda r: r['predicted'][(*nocont, *cell)] - r['parts'][cell][0]):>8.1f} "
              f"{med(lambda r: r['measured'][cell] - r['predicted'][(*headline, *cell)]):>+8.1f}")
    print("compute: one worker's forward + backward + update (the unprofiled anchor's serial rest included, x ranks/cores);\n"
          "all-red.: the policy's all-reduces as the round's link file prices them, back to back; meas-comp: the measured mean\n"
          "step beyond compute; pred-comp: the headline's, loop: with the matrix loop's contention, no cont.: without contention;\n"
          "unpriced: measured - predicted.")
    print("policy gain, measured vs predicted (fused / wfbp step time; headline):")
    for n in RANKS:
        for rate in RATES:
            meas = statistics.median(r["measured"][n, rate, "fused"] / r["measured"][n, rate, "wfbp"] for r in done)
            pred = statistics.median(r["predicted"][(*headline, n, rate, "fused")] / r["predicted"][(*headline, n, rate, "wfbp")] for r in done)
            print(f"  {n} ranks {rate:>8}: measured {meas:.3f}x, predicted {pred:.3f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"skipped": skipped,
                       "rounds": [{"load": r["load"], "iter_1_profiled_ms": r["iter_1_profiled_ms"], "iter_1_unprofiled_ms": r["iter_1_unprofiled_ms"],
                                   "measured": {"/".join(map(str, k)): v for k, v in r["measured"].items()},
                                   "predicted": {"/".join(map(str, k)): v for k, v in r["predicted"].items()}} for r in done],
                       "ablation": {"/".join(v): {"/".join(map(str, c)): x for c, x in e.items()} for v, e in table.items()}}, f, indent=1)
