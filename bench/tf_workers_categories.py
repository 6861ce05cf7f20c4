"""Where ``whatif --workers N`` of a 2-worker TF profile misses the N-worker job, category by category, on rounds kept by
``bench_workers_testbed.py --hosts`` (``DIR/tbw-NAME-K-w2``, ``-wN``). Per graph, ms per step and rank (averaged): the
rank's op time (every TF thread pool lane's ops, summed), the Python lane's, its process's CPU (every thread, the median
window step; runs recorded since 2026-12-06; a what-if keeps the profile's), the collectives' (each all-reduce's replayed
span, summed), and the step (``job_iteration_us``; with ``--cores C`` also queued on C
cores), for the 2-worker profile, its ``--workers N`` (each worker on cores of its own; the op times as profiled) and
the N-worker profile (its window, op times as that job's profiler saw them). No timing: run it anywhere.

    PYTHONPATH=src python bench/tf_workers_categories.py DIR [--workers 4] [--cores 2]
"""
from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from dagprof.analysis import job_iteration_us  # noqa: E402
from dagprof.errors import DagprofError  # noqa: E402
from dagprof.graph.dag import DeviceKind  # noqa: E402
from dagprof.passes.compute import share_cores  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.replay import replay  # noqa: E402
from dagprof.search import scenario  # noqa: E402
from dagprof.traces.events import Kind  # noqa: E402


def row(g) -> dict[str, float]:
    """ms per step and rank: ops on the thread pools' lanes, the Python lane's, the collectives' replayed spans, the step."""
    res = replay(g)
    steps, ranks = max(len(g.meta.steps), 1), max(int(g.world_size), 1)
    python = np.array([d.rank >= 0 and d.kind == DeviceKind.HOST and d.name.endswith("/python") for d in g.devices])
    pools = np.array([d.rank >= 0 and d.kind == DeviceKind.HOST and not d.name.endswith("/python") for d in g.devices])
    dev = np.asarray(g.device)
    kind = np.asarray(g.kind)
    work = ~np.isin(kind, [int(Kind.STEP), int(Kind.COMM_WAIT)])
    comm = kind == int(Kind.COMM)
    per = lambda mask: float(np.sum(np.asarray(g.dur)[mask])) / 1e3 / steps / ranks  # noqa: E731
    span = float(np.sum((res.end - res.start)[comm])) / 1e3 / steps
    loop = g.meta.loop_steps  # each rank's process CPU in the window (every thread; recorded since 2026-12-06), its median step
    cpu = [float(np.median(got)) for r in (loop.sched if loop else {}) if (got := [x.process_cpu_us for s, x in loop.sched[r].items()
                                                                                  if s in loop.profiled.get(r, {}) and x.process_cpu_us is not None])]
    return {"ops": per(pools[dev] & work), "python": per(python[dev] & work), "process cpu": float(np.mean(cpu)) / 1e3 if cpu else float("nan"),
            "collectives": span, "step": job_iteration_us(g) / 1e3}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kept")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--cores", type=int)
    a = p.parse_args()
    if not os.path.isdir(a.kept):
        raise SystemExit(f"tf_workers_categories: {a.kept}: no such folder of kept rounds")
    try:
        if not table(a):
            raise SystemExit(f"tf_workers_categories: {a.kept}: no kept 2-worker rounds (tbw-NAME-K-w2)")
    except DagprofError as e:  # a kept run that does not read: one line naming it
        raise SystemExit(f"tf_workers_categories: {e}") from None


def table(a: argparse.Namespace) -> int:
    """The categories of every kept 2-worker round in ``a.kept``, and of its N-worker job where kept, printed; how many rounds."""
    cols = ("ops", "python", "process cpu", "collectives", "step")
    print(f"{'round / graph':44s} " + " ".join(f"{c:>12s}" for c in cols) + (f" {'--cores':>9s}" if a.cores else ""))
    kept = sorted(d for d in os.listdir(a.kept) if re.fullmatch(r"tbw-.+-\d+-w2", d))
    for two in kept:
        four = os.path.join(a.kept, two[:-1] + str(a.workers))
        p2 = open_run(os.path.join(a.kept, two))
        c = scenario.Cluster()
        marked = scenario.profiled_at(p2.graph, c)
        graphs = [("2-worker profile", p2.graph),
                  (f"--workers {a.workers}", scenario.apply(marked, scenario.Scenario(workers=a.workers), c, scenario.base_topology(marked, c)))]
        if os.path.isdir(four):
            graphs.append((f"{a.workers}-worker profile", open_run(four).graph))
        for label, g in graphs:
            r = row(g)
            queued = f" {job_iteration_us(share_cores(g, a.cores)) / 1e3:9.1f}" if a.cores and g.world_size > a.cores else ""
            print(f"{two.removeprefix('tbw-').removesuffix('-w2') + ' ' + label:44s} " + " ".join(f"{r[k]:12.1f}" for k in cols) + queued,
                  flush=True)
    return len(kept)


if __name__ == "__main__":
    main()
