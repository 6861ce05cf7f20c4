"""FSDP2's HSDP layout what-if (``whatif --mesh RxS``) predicted against measured on the namespace testbed (root).

Each round, at each link rate (1 Gbit/s and 200 Mbit/s, ``tc tbf`` in ``collect.jobs.netns``; their order alternates by
round), ``bench/fsdp_train.py`` (``bench_fsdp.TESTBED_MODEL``: an MLP of 4 blocks, 5 units of about 1 MiB, AdamW) is
profiled on the layouts' ranks in each layout (``--layouts``, default 1x4 and 2x2; ``1x6,2x3,3x2`` puts replicate and
shard degrees that differ side by side; ``--hsdp R`` runs R x WORLD/R), in alternating order; each profile predicts every
other layout (``passes.fsdp_mesh.set_mesh``, as ``dagprof whatif --mesh`` does: the profiler's cost removed, the averaged
steps), then every layout runs unprofiled in a shuffled order and its mean step after warm-up (rank 0's) is the
measurement. Peak memory per rank: each layout run once with ``fsdp_train.py --memory`` on loopback (``bench_fsdp.
measured_peak``: the tensors alive as a step starts plus the heap's rise within it; memory does not depend on the link)
against each prediction of that layout (``fsdp_peak`` of ``with_mesh``, what ``whatif --mesh`` prints). The ranks share
this machine's 2 cores: say the load average beside the figures. Each profile's own step (its job, profiler on) and its
compute per rank per step are printed beside it: the same ops taking longer in one job than in another is the machine's
load, not the layout (docs/evidence.md).

    sudo .venv/bin/python bench/bench_hsdp_mesh.py [--rounds 3] [--steps 40] [--layouts 1x6,2x3,3x2] [--keep DIR]
    .venv/bin/python bench/bench_hsdp_mesh.py --offline DIR [--memory]  # predicted again (this code) from the profiles --keep kept
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fsdp import RATES, TESTBED_MODEL, WARMUP, job, measured_peak  # noqa: E402

MEMORY_STEPS = 6  # the --memory runs: the steps after warm-up (a step's memory is the same every step)


def mesh_flags(layout: str) -> list[str]:
    """``fsdp_train.py``'s flags of the layout ``RxS``: ``--hsdp R`` (R = 1: plain FSDP)."""
    from dagprof.passes.fsdp_mesh import parse_mesh

    return ["--hsdp", str(r)] if (r := parse_mesh(layout)[0]) > 1 else []


def world_of(layouts: list[str]) -> int:
    """The ranks every layout has (one job size)."""
    from dagprof.passes.fsdp_mesh import parse_mesh

    sizes = {math.prod(parse_mesh(x)) for x in layouts}
    if len(sizes) != 1 or len(layouts) < 2:
        raise SystemExit(f"--layouts: two or more layouts of one world size, got {','.join(layouts)}")
    return sizes.pop()


def predict(run: str, target: str) -> tuple[float, float, float, float]:
    """(the model of the profiled job, the target layout's step, ms; the target's peak memory per rank, MiB; the profiled
    job's own peak, MiB) from the profile ``run``."""
    from dagprof.analysis import job_iteration_us
    from dagprof.passes.fsdp_mesh import parse_mesh, with_mesh
    from dagprof.passes.profiler_cost import measure_profiler_cost, remove_profiler_cost
    from dagprof.pipeline import open_run
    from dagprof.search import scenario
    from dagprof.search.fsdp_memory import fsdp_peak
    from dagprof.units import MB

    base = open_run(run, template=True).graph
    base, _ = remove_profiler_cost(base, measure_profiler_cost(base), job_iteration_us)
    c = scenario.Cluster()
    topo = scenario.base_topology(base, c)
    model = job_iteration_us(scenario.apply(base, scenario.Scenario(), c, topo)) / 1e3
    mesh = parse_mesh(target)
    out = job_iteration_us(scenario.apply(base, scenario.Scenario(mesh=mesh), c, topo)) / 1e3
    peak = max(m.total for m in fsdp_peak(with_mesh(base, *mesh)).values()) / MB
    return model, out, peak, max(m.total for m in fsdp_peak(base).values()) / MB


def rank_comm_ms(g) -> dict[str, float]:
    """Rank 0's FSDP transfers per step by kind, ms (as measured, or as the link model priced them)."""
    from dagprof.graph.build_fsdp import fsdp_collectives, issuers

    cs = [c for c in fsdp_collectives(g) if 0 in issuers(g, c.node)]
    steps = len({int(g.step[c.node]) for c in cs})
    out: dict[str, float] = {}
    for c in cs:
        out[c.kind.label] = out.get(c.kind.label, 0.0) + float(g.dur[c.node]) / 1e3 / steps
    return out


def comm_check(keep: str, row: dict) -> str:
    """Rank 0's transfers per step of the prediction against the target layout's profile of the same round (both priced
    by their own profile's link fit: the model of the target's collectives, not the load's)."""
    from dagprof.passes.fsdp_mesh import parse_mesh
    from dagprof.pipeline import open_run
    from dagprof.search import scenario

    def model(run: str, mesh=None):
        g = open_run(run, template=True).graph
        c = scenario.Cluster()
        return scenario.apply(g, scenario.Scenario(mesh=mesh), c, scenario.base_topology(g, c))

    prefix = os.path.join(keep, f"run{row['round'] - 1}-{row['rate']}-")
    got, own = rank_comm_ms(model(prefix + row["profiled"], parse_mesh(row["target"]))), rank_comm_ms(model(prefix + row["target"]))
    return ", ".join(f"{k} {got.get(k, 0):.1f}/{own.get(k, 0):.1f}" for k in sorted(set(got) | set(own)))


def gauge(run: str) -> tuple[float, float]:
    """(the profiled job's own mean step in its window, its compute per rank per step), ms: the same ops taking longer in
    one profile than another is the machine's load (the ops do not depend on the link or the layout's collectives)."""
    import numpy as np

    from dagprof.pipeline import open_run
    from dagprof.traces.events import Kind

    g = open_run(run).graph
    steps = len(set(g.step[g.rank >= 0].tolist()))
    compute = g.dur[(g.rank >= 0) & np.isin(g.kind, [Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE])].sum() / 1e3 / steps / g.world_size
    with open(run + "-log/times.json") as f:
        times = json.load(f)[WARMUP + 1:-1]  # --profile-steps: the window
    return 1e3 * statistics.fmean(times), float(compute)


def measured_peaks(layouts: list[str], out_dir: str) -> dict[str, float]:
    """Each layout's peak memory per rank, MiB (``fsdp_train.py --memory`` on loopback)."""
    world = world_of(layouts)
    return {x: measured_peak(world, TESTBED_MODEL + mesh_flags(x), MEMORY_STEPS, os.path.join(out_dir, f"mem-{x}")) / 2**20 for x in layouts}


def offline(keep: str, memory: bool) -> tuple[list[float], list[float], list[float]]:
    """Each kept round's predictions made again from its kept profiles, against what was measured then; (time errors,
    memory errors, layout change errors), %. ``memory``: measure each layout's peak now where the kept run has none."""
    with open(os.path.join(keep, "hsdp_mesh.json")) as f:
        kept = json.load(f)
    rows = kept["rows"]
    peaks = kept.get("measured_peak_mib") or {}
    if memory and not peaks:
        with tempfile.TemporaryDirectory(prefix="dagprof-hsdp-mem-") as tmp:
            peaks = measured_peaks(sorted({r["target"] for r in rows} | {r["profiled"] for r in rows}), tmp)
    errors, mem_errors, changes = [], [], []
    for row in rows:
        run = os.path.join(keep, f"run{row['round'] - 1}-{row['rate']}-{row['profiled']}")
        model, ms, peak, _ = predict(run, row["target"])
        changes.append(change_error({**row, "predicted_ms": ms, "model_of_profiled_ms": model}))
        own, compute = gauge(run)
        errors.append(100 * (ms - row["measured_ms"]) / row["measured_ms"])
        mem = ""
        if row["target"] in peaks:
            mem_errors.append(100 * (peak - peaks[row["target"]]) / peaks[row["target"]])
            mem = f" measured {peaks[row['target']]:.2f} ({mem_errors[-1]:+.1f} %)"
        print(f"  round {row['round']} {row['rate']:7s} {row['profiled']} -> {row['target']}: predicted {ms:6.1f} ms (then {row['predicted_ms']:6.1f}), "
              f"measured {row['measured_ms']:6.1f} ms ({errors[-1]:+5.1f} %); model of the profile {model:6.1f} ms, the profiled "
              f"job's own step {own:6.1f} ms (compute {compute:.1f} ms a rank), its layout measured {row['measured_profiled_ms']:6.1f} ms; peak "
              f"{peak:.2f} MiB/rank{mem}; rank 0's transfers per step, predicted / the target's profile's model, ms: "
              f"{comm_check(keep, row)}; layout change {changes[-1]:+.1f} %; load then {row['load'][0]:.2f}-{row['load'][1]:.2f}", flush=True)
    return errors, mem_errors, changes


def change_error(row: dict) -> float:
    """The predicted layout change (prediction over the profile's own model) against the measured one (the target's step
    over the profiled layout's, both unprofiled), %: the error without the level each job ran at on the shared cores."""
    return 100 * ((row["predicted_ms"] / row["model_of_profiled_ms"]) / (row["measured_ms"] / row["measured_profiled_ms"]) - 1)


def summary(errors: list[float], mem_errors: list[float], changes: list[float]) -> None:
    a, c = sorted(map(abs, errors)), sorted(map(abs, changes))
    print(f"--mesh: median |error| {statistics.median(a):.2f} %, max {a[-1]:.2f} %, {sum(x <= 8 for x in a)} of {len(a)} within 8 % "
          f"(goal <= 3 % median, <= 8 % each); load {os.getloadavg()[0]:.2f}")
    print(f"--mesh layout change (predicted / the profile's model against measured target / measured profiled layout): "
          f"{', '.join(f'{x:+.1f}' for x in changes)} %, median |error| {statistics.median(c):.2f} %, max {c[-1]:.2f} %")
    if mem_errors:
        m = sorted(map(abs, mem_errors))
        print(f"--mesh peak memory per rank against the target layout's --memory run: {', '.join(f'{x:+.1f}' for x in mem_errors)} %, "
              f"max |error| {m[-1]:.1f} % (goal <= 10 %)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="steps per job (the first 3 warm up)")
    ap.add_argument("--rates", default="1Gbit,200Mbit", help=f"link rates, of {', '.join(RATES)}")
    ap.add_argument("--layouts", default="1x4,2x2", help="RxS layouts of one world size, each profiled, predicted from the others and measured")
    ap.add_argument("--keep", metavar="DIR", help="keep the profiles and hsdp_mesh.json (every figure) in DIR")
    ap.add_argument("--offline", metavar="DIR", help="predict again from the runs --keep kept in DIR; runs no timed job")
    ap.add_argument("--memory", action="store_true", help="with --offline: measure each layout's peak memory (loopback) where DIR has none")
    args = ap.parse_args()
    if args.offline:
        summary(*offline(args.offline, args.memory))
        return
    from dagprof.collect.jobs.netns import Cluster, available

    why = available()
    if why:
        print(f"skipped: {why}")
        return
    rates, layouts = args.rates.split(","), args.layouts.split(",")
    world = world_of(layouts)
    rows, errors, mem_errors, changes = [], [], [], []
    t0 = time.perf_counter()
    print(f"--mesh what-if on the namespace testbed: {world} gloo ranks, layouts {', '.join(layouts)}, {args.steps} steps a job, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    with Cluster(world) as cluster, contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="dagprof-hsdp-"))
        os.makedirs(tmp, exist_ok=True)
        peaks = measured_peaks(layouts, tmp)
        print(f"  peak memory per rank measured (--memory, loopback): {', '.join(f'{x} {m:.2f} MiB' for x, m in peaks.items())}", flush=True)
        for k in range(args.rounds):
            for rate in rates[::1 if k % 2 == 0 else -1]:
                cluster.set_rate(RATES[rate])
                loads = [os.getloadavg()[0]]
                runs, predicted, measured = {}, {}, {}
                for layout in layouts[::1 if k % 2 == 0 else -1]:
                    runs[layout] = os.path.join(tmp, f"run{k}-{rate}-{layout}")
                    job(world, TESTBED_MODEL + mesh_flags(layout), args.steps, runs[layout] + "-log", cluster, profile=runs[layout], kineto=False)
                    loads.append(os.getloadavg()[0])
                for source, target in itertools.permutations(layouts, 2):
                    predicted[(source, target)] = predict(runs[source], target)
                for layout in random.Random(k).sample(layouts, len(layouts)):
                    measured[layout] = job(world, TESTBED_MODEL + mesh_flags(layout), args.steps, os.path.join(tmp, f"m{k}-{rate}-{layout}"), cluster,
                                           stat=statistics.fmean)
                    loads.append(os.getloadavg()[0])
                for (source, target), (model, ms, peak, _) in predicted.items():
                    err = 100 * (ms - measured[target]) / measured[target]
                    mem_err = 100 * (peak - peaks[target]) / peaks[target]
                    errors.append(err)
                    mem_errors.append(mem_err)
                    own, compute = gauge(runs[source])
                    rows.append({"round": k + 1, "rate": rate, "profiled": source, "target": target, "model_of_profiled_ms": model,
                                 "profiled_job_ms": own, "profiled_compute_ms": compute, "measured_profiled_ms": measured[source], "predicted_ms": ms,
                                 "measured_ms": measured[target], "error_pct": err, "peak_mib": peak, "measured_peak_mib": peaks[target],
                                 "peak_error_pct": mem_err, "load": [min(loads), max(loads)]})
                    changes.append(change_error(rows[-1]))
                    print(f"  round {k + 1} {rate:7s} {source} -> {target}: predicted {ms:6.1f} ms, measured {measured[target]:6.1f} ms "
                          f"({err:+5.1f} %); model of the {source} profile {model:6.1f} ms, its job's own step {own:6.1f} ms (compute {compute:.1f} ms "
                          f"a rank), its layout measured {measured[source]:6.1f} ms; peak {peak:.2f} MiB/rank, measured {peaks[target]:.2f} "
                          f"({mem_err:+.1f} %); layout change {changes[-1]:+.1f} %; load {min(loads):.2f}-{max(loads):.2f} "
                          f"({time.perf_counter() - t0:.0f} s)", flush=True)
                if args.keep:
                    with open(os.path.join(args.keep, "hsdp_mesh.json"), "w") as f:
                        json.dump({"steps": args.steps, "layouts": layouts, "measured_peak_mib": peaks, "rows": rows}, f, indent=1)
    summary(errors, mem_errors, changes)


if __name__ == "__main__":
    main()
