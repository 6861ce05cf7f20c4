"""Where a TF profile's excess over its unprofiled steps lies, and what the profiler-cost correction does with it (no job, no
root). ``where RUN...``: per rank and kind of op, time and gaps a profiled step (ms; the correction scales the host's ops and
gaps by one factor, keeps the collectives), before and after the correction, and the per-event cost (us taken from each host
op's gap, then its time) that would drop the model by the same share, beside the CPU the profiler added per event: a
tracing cost is per event, a load stretches the long ops. ``rounds KEEP NAME RATE OTHER N``: a ``bench_frameworks.py
--testbed --keep KEEP`` folder's rounds predicted both ways, ``--raw`` against the other rate's profiled median step and
corrected against its unprofiled median (``predict_rate`` prices it raw only); and each job of a round (all profiled) as
its model, corrected at its own rate, against its own unprofiled median, with the profiler-cost line it said.

    PYTHONPATH=src python bench/tf_cost_where.py where RUN...
    PYTHONPATH=src python bench/tf_cost_where.py rounds KEEP tf_tft_forecast_fit 200e6 80e6 2
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from shaped_loopback import measured, rate_models, wire_rate  # noqa: E402

from dagprof.analysis import job_iteration_us  # noqa: E402
from dagprof.graph.dag import Graph  # noqa: E402
from dagprof.passes.link_fit import priced_world_size  # noqa: E402
from dagprof.passes.profiler_cost import _host_work, correct_profiler_cost, job_sched, measure_profiler_cost, steady_from  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search.scenario import Scenario  # noqa: E402
from dagprof.search.whatif import evaluate  # noqa: E402
from dagprof.traces.events import Kind  # noqa: E402

MOST_PER_EVENT_US = 200.0  # the per-event search's ceiling: 100 times the profiler's CPU per event seen on TF (1.3-2.7 us)


def per_event(g: Graph, us: float) -> Graph:
    """``g`` with ``us`` taken from each host op's gap, the rest of it from its time (never below 0)."""
    _, mask = _host_work(g)
    gap, dur = g.gap.copy(), g.dur.copy()
    take = np.minimum(gap[mask], us)
    gap[mask] -= take
    dur[mask] = np.maximum(dur[mask] - (us - take), 0.0)
    return g.replace(gap=gap, dur=dur)


def by_kind(g: Graph) -> dict[tuple[int, str], tuple[float, float, float]]:
    """(rank, kind) -> (ops, time ms, gaps ms) a profiled step; rank -1: the collectives' group."""
    steps = max(len(g.meta.steps), 1)
    out = {}
    for r in sorted(set(g.rank.tolist())):
        for k in sorted(set(g.kind[g.rank == r].tolist())):
            m = (g.rank == r) & (g.kind == k)
            if Kind(k) not in (Kind.SYNC, Kind.STEP):
                out[(r, Kind(k).name)] = (m.sum() / steps, g.dur[m].sum() / steps / 1e3, g.gap[m].sum() / steps / 1e3)
    return out


def where(run: str) -> None:
    g = open_run(run).graph
    cost = measure_profiler_cost(g)
    fix = correct_profiler_cost(g, cost, job_iteration_us)
    raw, target = job_iteration_us(g), job_iteration_us(fix.graph)
    print(f"{run}: {cost.describe()[:160]}")
    print(f"  model {raw / 1e3:.2f} ms as profiled, {target / 1e3:.2f} corrected (factor {fix.factor:.3f}), unprofiled median "
          f"{'-' if cost.unprofiled_us is None else f'{cost.unprofiled_us / 1e3:.2f}'} ms")
    before, after = by_kind(g), by_kind(fix.graph)
    for key, (n, t, gap) in before.items():
        print(f"  rank {key[0]:>2} {key[1]:<13} {n:7.1f} ops  time {t:6.2f} -> {after[key][1]:6.2f}  gaps {gap:6.2f} -> {after[key][2]:6.2f} ms")
    loop = g.meta.loop_steps
    if fix.factor < 1.0:
        lo, hi = 0.0, MOST_PER_EVENT_US
        for _ in range(25):
            lo, hi = (lo, (lo + hi) / 2) if job_iteration_us(per_event(g, (lo + hi) / 2)) <= target else ((lo + hi) / 2, hi)
        reached = job_iteration_us(per_event(g, hi))
        print(f"  per event: {hi:.1f} us from each host op {'drops' if reached <= target * 1.002 else 'cannot drop'} the model to "
              f"{reached / 1e3:.2f} ms (the correction's {target / 1e3:.2f})")
    if loop is not None and loop.sched:
        first, window = steady_from(loop), set(g.meta.steps)
        cpu = [job_sched(loop, w, first, "process_cpu_us") for w in (window, None)]
        waits = [job_sched(loop, w, first, "wait_us") for w in (window, None)]
        _, mask = _host_work(g)
        events = mask.sum() / max(len(g.meta.steps), 1)
        if all(cpu) and all(waits):
            added = statistics.median(cpu[0]) - statistics.median(cpu[1])
            print(f"  the ranks' CPU {added / 1e3:+.2f} ms a step in the window ({added / events:+.2f} us per host op), their training "
                  f"threads' waits for a core {statistics.median(waits[0]) / 1e3:.1f} ms a step in it, {statistics.median(waits[1]) / 1e3:.1f} outside")


def own(run: str, rate: float) -> tuple[float | None, str]:
    """A profiled job's model as the what-ifs start from it (corrected, the link fitted at the job's own ``rate``): its median
    step against the job's own unprofiled median, % (None where it timed too few), and the profiler-cost line."""
    p = open_run(run)
    m = rate_models(p.graph, run, rate, rate)
    res = evaluate(p.graph, [Scenario(bandwidth=wire_rate(rate, priced_world_size(p.graph), m.share))], m.settings,
                   measured_us=p.analysis.measured_us, tolerance_pct=None)
    ref = measured(run)["unprofiled_median_ms"]
    point = res["scenarios"][0].interval.point_us / 1e3
    return (None if ref is None else 100 * (point / ref - 1)), res["profiler_cost"]["text"]


def rounds(keep: str, name: str, fast: float, slow: float, n: int) -> None:
    """Each round's what-if, and every job of the round (each profiled: the reference jobs too) against its own unprofiled steps."""
    for k in range(n):
        prof, other = (os.path.join(keep, f"tb-{name}-{k}-{int(r / 1e6)}M") for r in (fast, slow))
        p = open_run(prof)
        m = rate_models(p.graph, prof, fast, slow)
        s = [Scenario(bandwidth=wire_rate(slow, priced_world_size(p.graph), m.share))]
        got = measured(other)
        for raw in (True, False):
            row = evaluate(p.graph, s, m.settings, measured_us=p.analysis.measured_us, tolerance_pct=None, raw=raw)["scenarios"][0]
            pred, ref = row.interval.point_us / 1e3, got["measured_median_ms" if raw else "unprofiled_median_ms"]
            alt = got["unprofiled_median_ms" if raw else "measured_median_ms"]
            print(f"round {k + 1} {'raw      ' if raw else 'corrected'} predicted {pred:.2f} ms (90 %: {row.interval.lo_us / 1e3:.1f}-"
                  f"{row.interval.hi_us / 1e3:.1f}) against {ref:.2f} measured ({'profiled' if raw else 'unprofiled'} median): "
                  f"{100 * (pred / ref - 1):+.1f} %; against the other median {100 * (pred / alt - 1):+.1f} %")
        for run, rate in ((prof, fast), (f"{prof}-before", fast), (other, slow), (f"{prof}-after", fast)):
            if os.path.isdir(run):
                err, line = own(run, rate)
                print(f"  own {os.path.basename(run)}: model {'-' if err is None else f'{err:+.1f} %'} against its unprofiled median; {line}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("where")
    w.add_argument("runs", nargs="+")
    r = sub.add_parser("rounds")
    r.add_argument("keep")
    r.add_argument("name")
    r.add_argument("rate", type=float)
    r.add_argument("other_rate", type=float)
    r.add_argument("rounds", type=int)
    args = ap.parse_args(argv)
    if args.cmd == "where":
        for run in args.runs:
            where(run)
    else:
        rounds(args.keep, args.name, args.rate, args.other_rate, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
