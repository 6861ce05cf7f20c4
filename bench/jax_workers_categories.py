"""Where ``whatif --workers N --cores C`` of a 2-worker JAX profile misses the N-worker job on C cores, by category, on rounds
kept by ``bench_workers_testbed.py --hosts`` (``DIR/tbw-NAME-K-w2``, ``-wN``): ``tf_workers_categories.py``'s split for JAX,
from the threads' records (``traces.meta.StepSched``, per thread name and per ``python#TID``).

Per job, ms per step and rank (median over the unprofiled steps past the warm-up, ``passes.comm_cpu.rank_cpu``'s steps; the
mean over the profiled ranks): the Python (training) thread's CPU, the lanes' threads' CPU (``lane_threads``: the Eigen
pool and the client lanes joined to their ``python#TID``), gloo's busy thread's (the busiest ``python#TID`` no lane joins),
the rest of the process's CPU, and every thread's waits for a core (run-queue time). ``demand`` is the ranks' CPU a step over
the cores (N x process / C). Then the step: the 2-worker job's unprofiled median, the prediction's (``--cores C``'s
replayed median; its collectives' transfer per step, ``comm_per_step_ms``, own cores) and the N-worker job's unprofiled
median (and its collectives' as measured: issue to done, with the waits for slower ranks and for a core). What the
prediction carries of each CPU category is the 2-worker profile's (a copied rank's), but for its off-lane CPU (gloo's
thread and the rest): the queue's own off-lane nodes a step and rank (``passes.comm_cpu.spin_share``, through each
collective's transfer), shown as gloo's; the rest of a category's 2 -> N growth is what the what-if leaves out of the
queue. The waits are as recorded (the prediction's are its queue's, not split here).
``load``: a job's own (its ranks' CPU over the cores' time in its step), the prediction's its replay's (the fixed point its
collectives' waits for a core are priced at).
``--per-call``: instead, per job gloo's busy thread's CPU and the collectives' issue to done per gloo call (one per operand,
``GraphMeta.collective_operands_per_step``) and ring step (2(N-1) an all-reduce), ms: the thread's median and lower quartile
over the steps above (mean over ranks), the collectives' median over the profiled steps. Pricing it per ring step carried
the 2-worker median x3 (before jax68); the N-worker job's is what a price should meet (kept rounds, 2026-12-07: the
quartile is no better).
No timing: run it anywhere.

    PYTHONPATH=src python bench/jax_workers_categories.py DIR [--only jax_shardmap,jax_two_tower] [--workers 4] [--cores 2] [--per-call]
"""
from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from shaped_loopback import comm_per_step_ms, measured  # noqa: E402
from whatif_cli import Refused, whatif_json  # noqa: E402

from dagprof.errors import DagprofError  # noqa: E402
from dagprof.graph.meta import WARMUP_STEPS  # noqa: E402
from dagprof.passes.comm_cpu import lane_threads  # noqa: E402
from dagprof.passes.compute import replayed_load  # noqa: E402
from dagprof.passes.link_fit import priced_comm  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.replay import replay  # noqa: E402
from dagprof.search.scenario import Cluster, Scenario, apply, base_topology, profiled_at  # noqa: E402
from dagprof.traces.meta import is_unnamed_thread  # noqa: E402

CPU = ("python", "lanes", "gloo", "rest", "process")
WAIT = ("python", "lanes", "gloo", "rest")


def rank_steps(g, r: int) -> tuple[list, set[str], str | None]:
    """Rank ``r``'s steps recorded by thread (its unprofiled steps past the warm-up, else all), its lanes' thread names
    (``lane_threads``) and gloo's busy thread (the busiest ``python#TID`` no lane joins; None: none)."""
    loop = g.meta.loop_steps
    steps = loop.sched.get(r, {})
    got = [x for s, x in steps.items() if x.process_cpu_us is not None and x.named is not None
           and s >= WARMUP_STEPS and s not in loop.profiled.get(r, {})]
    got = got or [x for x in steps.values() if x.process_cpu_us is not None and x.named is not None]
    lanes = lane_threads(g, r)
    unnamed = {n for x in got for n in x.named if is_unnamed_thread(n) and n not in lanes}
    return got, lanes, max(unnamed, key=lambda n: sum(x.named[n].cpu_us for x in got if n in x.named), default=None)


def threads(g) -> dict[str, float]:
    """ms per step and rank: each category's CPU (``CPU``) and waits for a core (``wait ...``), medians over each profiled
    rank's unprofiled steps past the warm-up (else all its recorded steps), meaned over the ranks."""
    loop = g.meta.loop_steps
    if loop is None:
        raise DagprofError("the run did not record its threads a step (no loop_steps)")
    rows = []
    for r in sorted(loop.sched):
        got, lanes, gloo = rank_steps(g, r)
        if not got:
            continue
        per = []
        for x in got:
            lane = [c for n, c in x.named.items() if n in lanes]
            gl = x.named.get(gloo) if gloo else None
            cpu = {"python": x.cpu_us, "lanes": sum(c.cpu_us for c in lane), "gloo": gl.cpu_us if gl else 0.0, "process": x.process_cpu_us}
            cpu["rest"] = cpu["process"] - cpu["python"] - cpu["lanes"] - cpu["gloo"]
            others_wait = x.others.wait_us if x.others is not None else sum(c.wait_us for c in x.named.values())
            wait = {"python": x.wait_us, "lanes": sum(c.wait_us for c in lane), "gloo": gl.wait_us if gl else 0.0}
            wait["rest"] = others_wait - wait["lanes"] - wait["gloo"]
            per.append([cpu[k] for k in CPU] + [wait[k] for k in WAIT])
        rows.append(np.median(np.array(per), axis=0))
    if not rows:
        raise DagprofError("no rank recorded its threads by name a step")
    mean = np.mean(rows, axis=0) / 1e3
    return dict(zip(list(CPU) + [f"wait {k}" for k in WAIT], mean.tolist()))


def per_call(g) -> dict[str, float]:
    """ms per gloo call and ring step of ``g`` (``--per-call``): gloo's busy thread's CPU, median and lower quartile over each
    profiled rank's steps (``threads``' steps and thread; mean over the ranks), and the collectives' issue to done a step
    (profiled steps, median)."""
    calls = g.meta.collective_operands_per_step
    if not calls or g.meta.loop_steps is None:
        raise DagprofError("the run did not record its collectives' operands and its threads a step")
    per = calls * 2 * (int(g.world_size) - 1)
    rows = []
    for r in sorted(g.meta.loop_steps.sched):
        got, _, gloo = rank_steps(g, r)
        if gloo is None:
            continue
        cpu = np.array([x.named[gloo].cpu_us if gloo in x.named else 0.0 for x in got]) / per / 1e3
        rows.append([np.median(cpu), np.quantile(cpu, 0.25)])
    if not rows:
        raise DagprofError("no rank recorded its threads by name a step")
    comm = priced_comm(g)
    took = np.bincount(g.step[comm], weights=g.dur[comm])[np.unique(g.step[comm])]
    gloo_median, gloo_quartile = np.mean(rows, axis=0).tolist()
    return {"calls": calls, "gloo": gloo_median, "gloo q25": gloo_quartile, "comm": float(np.median(took)) / per / 1e3}


def predicted(two: str, workers: int, cores: int) -> dict[str, float]:
    """The user's ``dagprof whatif RUN --workers N --cores C``: its replayed median step, the re-priced collectives'
    transfer per step (own cores: the link model's part alone), the cores' load in its replay (the fixed point its
    waits for a core are priced at, ``passes.compute.replayed_load``) and its off-lane CPU queued a step and rank, ms."""
    d = whatif_json(two, "--workers", str(workers), "--cores", str(cores))
    g = open_run(two).graph
    got = {"step": d["scenarios"][0]["predicted_median_ms"]}
    for key, c in (("comm", Cluster()), ("load", Cluster(cores=cores))):
        marked = profiled_at(g, c)
        what_if = apply(marked, Scenario(workers=workers), c, base_topology(marked, c))
        on = np.array([i for i, x in enumerate(what_if.devices) if x.rank < 0 and x.capacity == cores and x.name.startswith("host")])
        got[key] = comm_per_step_ms(what_if) if key == "comm" else replayed_load(what_if, replay(what_if), on)
    off = [i for i in range(len(what_if)) if ".off-lane cpu " in what_if.node_name(i)]  # the cores' graph: its CPU nodes
    got["off_lane"] = float(what_if.dur[off].sum()) / workers / max(len(what_if.meta.steps), 1) / 1e3
    return got


def per_call_table(a: argparse.Namespace, kept: list[str]) -> int:
    """Print each kept round's ``per_call`` at 2 and N workers; how many rounds."""
    cols = ("gloo", "gloo q25", "comm")
    print(f"{'round':28s} {'calls':>5s} | 2 workers: " + " ".join(f"{c:>9s}" for c in cols) + f" | {a.workers} workers: "
          + " ".join(f"{c:>9s}" for c in cols) + f" | {a.workers}w gloo over the 2w median, quartile")
    for two in kept:
        p2, p4 = (per_call(open_run(os.path.join(a.kept, two[:-1] + w)).graph) for w in ("2", str(a.workers)))
        print(f"{two.removeprefix('tbw-').removesuffix('-w2'):28s} {p2['calls']:5.0f} | 2 workers: " + " ".join(f"{p2[c]:9.3f}" for c in cols)
              + f" | {a.workers} workers: " + " ".join(f"{p4[c]:9.3f}" for c in cols)
              + f" | {p4['gloo'] / p2['gloo']:5.2f} {p4['gloo'] / p2['gloo q25']:5.2f}", flush=True)
    return len(kept)


def table(a: argparse.Namespace) -> int:
    """Print each kept round's split; how many rounds."""
    names = a.only.split(",") if a.only else None
    kept = sorted(d for d in os.listdir(a.kept) if (m := re.fullmatch(r"tbw-(.+)-\d+-w2", d)) and (names is None or m[1] in names)
                  and os.path.isdir(os.path.join(a.kept, d[:-1] + str(a.workers))))
    if a.per_call:
        return per_call_table(a, kept)
    cols = list(CPU) + [f"wait {k}" for k in WAIT]
    print(f"{'round / job':32s} " + " ".join(f"{c:>12s}" for c in cols) + f" {'demand':>8s} {'comm':>8s} {'step':>8s} {'load':>6s}")
    done = 0
    for two in kept:
        four = os.path.join(a.kept, two[:-1] + str(a.workers))
        tag = two.removeprefix("tbw-").removesuffix("-w2")
        t2, t4 = threads(open_run(os.path.join(a.kept, two)).graph), threads(open_run(four).graph)
        m2, m4 = measured(os.path.join(a.kept, two)), measured(four)
        try:
            pred = predicted(os.path.join(a.kept, two), a.workers, a.cores)
        except Refused as e:
            pred = {"step": float("nan"), "comm": float("nan"), "load": float("nan")}
            print(f"{tag}: the what-if refused: {e}")
        carried = t2 | {"gloo": pred.get("off_lane", float("nan")), "rest": 0.0}  # the prediction's off-lane CPU, as queued
        carried["process"] = carried["python"] + carried["lanes"] + carried["gloo"] + carried["rest"]
        for label, t, n, comm, step, load in (
                ("2 workers", t2, 2, m2["comm_ms"], m2["unprofiled_median_ms"], None),
                (f"--workers {a.workers} --cores {a.cores}", carried, a.workers, pred["comm"], pred["step"], pred["load"]),
                (f"{a.workers} workers", t4, a.workers, m4["comm_ms"], m4["unprofiled_median_ms"], None)):
            demand = n * t["process"] / a.cores if n > a.cores else t["process"]
            step = step if step is not None else float("nan")
            load = n * t["process"] / (a.cores * step) if load is None else load  # a job's own: its ranks' CPU over the cores' time
            print(f"{tag + ' ' + label:32s} " + " ".join(f"{t[c]:12.2f}" for c in cols)
                  + f" {demand:8.1f} {comm:8.1f} {step:8.1f} {load:6.2f}", flush=True)
        done += 1
    return done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kept")
    p.add_argument("--only")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--per-call", action="store_true", help="gloo's CPU and the collectives a call and ring step, 2 vs N workers")
    a = p.parse_args()
    if not os.path.isdir(a.kept):
        raise SystemExit(f"jax_workers_categories: {a.kept}: no such folder of kept rounds")
    try:
        if not table(a):
            raise SystemExit(f"jax_workers_categories: {a.kept}: no kept round pairs (tbw-NAME-K-w2 with -w{a.workers})")
    except DagprofError as e:  # a kept run that does not read: one line naming it
        raise SystemExit(f"jax_workers_categories: {e}") from None


if __name__ == "__main__":
    main()
