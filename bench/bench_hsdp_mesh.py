"""FSDP2's HSDP layout what-if (``whatif --mesh RxS``) predicted against measured on the namespace testbed (root).

Each round, at each link rate (1 Gbit/s and 200 Mbit/s, ``tc tbf`` in ``collect.jobs.netns``; their order alternates by
round), ``bench/fsdp_train.py`` (``bench_fsdp.TESTBED_MODEL``: an MLP of 4 blocks, 5 units of about 1 MiB, AdamW) is
profiled on 4 ranks as plain FSDP (1x4) and as HSDP (``--hsdp 2``: 2x2), the two in alternating order; each profile
predicts the other layout (``passes.fsdp_mesh.set_mesh``, as ``dagprof whatif --mesh`` does: the profiler's cost
removed, the averaged steps), then both layouts run unprofiled in a shuffled order and their mean step after warm-up
(rank 0's) is the measurement. Peak memory per rank: the prediction against the target layout's own profile's model.
4 ranks share this machine's cores: say the load average beside the figures. Two rounds at load 1.4-8 (2026-12-03),
kept in /tmp/hsdpmesh/run2 and run3, predicted again offline (joins and releases following the group, load 3.5-8):
200 Mbit/s -2.6 / -6.8 % (1x4 -> 2x2) and -7.7 / +2.5 % (2x2 -> 1x4), 1 Gbit/s +11.8 / +25.6 % and -19.8 / -1.9 %
(with them carried as profiled: +4.1 / +0.2, -9.5 / +0.0, +25.8 / +43.1, -23.2 / -5.5 %; README); three rounds at load
15-30 swung 2x between jobs of one layout (-48 to +128 %).

    sudo .venv/bin/python bench/bench_hsdp_mesh.py [--rounds 3] [--steps 40] [--keep DIR]
    .venv/bin/python bench/bench_hsdp_mesh.py --offline DIR  # predicted again (this code) from the profiles --keep kept
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fsdp import RATES, TESTBED_MODEL, job  # noqa: E402

LAYOUTS = {"1x4": [], "2x2": ["--hsdp", "2"]}


def predict(run: str, target: str) -> tuple[float, float, float, float]:
    """(the model of the profiled job, the target layout's step, ms; the target's peak memory per rank, MiB; the profiled
    job's own peak, MiB) from the profile ``run``."""
    from dagprof.analysis import job_iteration_us
    from dagprof.passes.fsdp_mesh import parse_mesh, with_mesh
    from dagprof.passes.profiler_cost import measure_profiler_cost, remove_profiler_cost
    from dagprof.pipeline import open_run
    from dagprof.search import scenario
    from dagprof.search.memory import fsdp_peak
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
        out[c.kind] = out.get(c.kind, 0.0) + float(g.dur[c.node]) / 1e3 / steps
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


def offline(keep: str) -> list[float]:
    """Each kept round's predictions made again from its kept profiles, against what was measured then."""
    with open(os.path.join(keep, "hsdp_mesh.json")) as f:
        rows = json.load(f)["rows"]
    errors = []
    for row in rows:
        _, ms, peak, _ = predict(os.path.join(keep, f"run{row['round'] - 1}-{row['rate']}-{row['profiled']}"), row["target"])
        errors.append(100 * (ms - row["measured_ms"]) / row["measured_ms"])
        print(f"  round {row['round']} {row['rate']:7s} {row['profiled']} -> {row['target']}: predicted {ms:6.1f} ms (then {row['predicted_ms']:6.1f}), "
              f"measured {row['measured_ms']:6.1f} ms ({errors[-1]:+5.1f} %); model of the profile {row['model_of_profiled_ms']:6.1f} ms, its layout "
              f"measured {row['measured_profiled_ms']:6.1f} ms; peak {peak:.2f} MiB/rank (the target profile's model "
              f"{row['target_profile_peak_mib']:.2f}); rank 0's transfers per step, predicted / the target's profile's model, ms: "
              f"{comm_check(keep, row)}; load then {row['load'][0]:.2f}-{row['load'][1]:.2f}", flush=True)
    return errors


def summary(errors: list[float]) -> None:
    a = sorted(map(abs, errors))
    print(f"--mesh: median |error| {statistics.median(a):.2f} %, max {a[-1]:.2f} % over {len(a)} predictions (goal <= 3 % median, <= 8 % each); "
          f"load {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="steps per job (the first 3 warm up)")
    ap.add_argument("--rates", default="1Gbit,200Mbit", help=f"link rates, of {', '.join(RATES)}")
    ap.add_argument("--keep", metavar="DIR", help="keep the profiles and hsdp_mesh.json (every figure) in DIR")
    ap.add_argument("--offline", metavar="DIR", help="predict again from the runs --keep kept in DIR; runs no job")
    args = ap.parse_args()
    if args.offline:
        summary(offline(args.offline))
        return
    from dagprof.collect.jobs.netns import Cluster, available

    why = available()
    if why:
        print(f"skipped: {why}")
        return
    rates = args.rates.split(",")
    rows, errors = [], []
    t0 = time.perf_counter()
    print(f"--mesh what-if on the namespace testbed: 4 gloo ranks, {args.steps} steps a job, load {os.getloadavg()[0]:.2f}", flush=True)
    with Cluster(4) as cluster, contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="dagprof-hsdp-"))
        os.makedirs(tmp, exist_ok=True)
        for k in range(args.rounds):
            for rate in rates[::1 if k % 2 == 0 else -1]:
                cluster.set_rate(RATES[rate])
                loads = [os.getloadavg()[0]]
                runs, predicted, measured = {}, {}, {}
                for layout in list(LAYOUTS)[::1 if k % 2 == 0 else -1]:
                    runs[layout] = os.path.join(tmp, f"run{k}-{rate}-{layout}")
                    job(4, TESTBED_MODEL + LAYOUTS[layout], args.steps, runs[layout] + "-log", cluster, profile=runs[layout], kineto=False)
                    loads.append(os.getloadavg()[0])
                for source, target in (("1x4", "2x2"), ("2x2", "1x4")):
                    predicted[(source, target)] = predict(runs[source], target)
                for layout in random.Random(k).sample(list(LAYOUTS), len(LAYOUTS)):
                    measured[layout] = job(4, TESTBED_MODEL + LAYOUTS[layout], args.steps, os.path.join(tmp, f"m{k}-{rate}-{layout}"), cluster,
                                           stat=statistics.fmean)
                    loads.append(os.getloadavg()[0])
                for (source, target), (model, ms, peak, _) in predicted.items():
                    err = 100 * (ms - measured[target]) / measured[target]
                    errors.append(err)
                    target_peak = predicted[(target, source)][3]
                    rows.append({"round": k + 1, "rate": rate, "profiled": source, "target": target, "model_of_profiled_ms": model,
                                 "measured_profiled_ms": measured[source], "predicted_ms": ms, "measured_ms": measured[target], "error_pct": err,
                                 "peak_mib": peak, "target_profile_peak_mib": target_peak, "load": [min(loads), max(loads)]})
                    print(f"  round {k + 1} {rate:7s} {source} -> {target}: predicted {ms:6.1f} ms, measured {measured[target]:6.1f} ms "
                          f"({err:+5.1f} %); model of the {source} profile {model:6.1f} ms against its layout measured {measured[source]:6.1f} ms; "
                          f"peak {peak:.2f} MiB/rank (the {target} profile's model {target_peak:.2f}); load {min(loads):.2f}-{max(loads):.2f} "
                          f"({time.perf_counter() - t0:.0f} s)", flush=True)
                if args.keep:
                    with open(os.path.join(args.keep, "hsdp_mesh.json"), "w") as f:
                        json.dump({"steps": args.steps, "rows": rows}, f, indent=1)
    summary(errors)


if __name__ == "__main__":
    main()
