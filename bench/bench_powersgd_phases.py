"""Where a PowerSGD strategy's measured step spends the time its prediction does not have, phase by phase.

Runs nothing: reads a kept strategy folder (the demo's ``dagprof-demo/``, or ``bench_optimize.py --keep``'s
``wI-R/lossy``) whose verification rounds were profiled by dagprof's hooks (our demo jobs; a ``cmd:`` job's rounds
carry no hook records and are refused in one line). Per round, the strategy run's own profile gives, on both ranks'
clock (one host: the namespace testbed), when each bucket's hook was entered on the later rank (ready), when the
earlier rank saw it complete (done), the backward's end and the step's end; the round's profile of the defaults,
predicted under the strategy as ``bench_optimize.py --repredict`` predicts it, gives the same marks on the replayed
timeline. Medians over steps and rounds, ms from the step's start:

    .venv/bin/python bench/bench_powersgd_phases.py KEPT_STRATEGY_FOLDER [--run SEARCHED_RUN] [--json]

On the kept quiet runs (2 ranks, 200 Mbit/s, load about 1.5), predicted minus measured: the compute before the first
bucket is predicted 0-6 ms slow in every cell (the defaults' profile keeps contention the overlap slowdown does not
take out: the demo's rank 1 ran ``layers.7.conv1``'s backward in 15.8 ms (median) beside DDP's buckets, 3.8 ms in the
strategy run, predicted 10.5), and PowerSGD's chains (ready to done) are predicted short: a single bucket after the
backward by 0.4 (mlp), 5.0 (conv), 1.9 (LSTM), 1.1 and 4.0 ms (embedding; its second run's codec costs put the hook's
CPU at 3.9 ms against 6.3 in the first, the same shapes); the first of two buckets, its callbacks beside the
backward, by 5.3 (demo) and 6.8 ms (cnn), +1.1 (transformer), and within 0.6 ms, +4.4 in the transformer, once they
are priced as running beside it (``passes.compression``); after it the demo's last bucket took 12.6 ms against 7.0,
and the cnn's backward ended 12.4 ms later than predicted. The cells within 5 % are these misses cancelling.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

from dagprof.collect.deploy.strategy import load_strategy
from dagprof.errors import DagprofError
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.search.optimize import predict_run
from dagprof.traces.events import Kind
from dagprof.traces.run_schema import Rec


def measured_marks(run_dir: str) -> list[dict[str, float]]:
    """Per profiled step of a strategy run: the phase marks (ms from the step's start) from its ranks' hook records."""
    files = sorted(f for f in os.listdir(run_dir) if f.startswith("rank") and f.endswith(".json"))
    steps: dict[int, dict[int, dict]] = {}
    for f in files:
        rf = json.load(open(os.path.join(run_dir, f)))
        step, ev = None, {}
        for code, a, _b, t, _x in rf["records"]:
            if code == Rec.STEP_BEGIN:
                step, ev = a, {"t0": t, "ready": {}, "done": {}, "bwd": t}
                steps.setdefault(step, {})[rf["rank"]] = ev
            elif step is None:
                continue
            elif code == Rec.STEP_END:
                ev["t1"] = t
            elif code == Rec.ENQ_BEGIN:
                ev["ready"][a] = t
            elif code == Rec.COMM_DONE:
                ev["done"][a] = t
            elif code == Rec.BWD_END:
                ev["bwd"] = t
    out = []
    for per in steps.values():
        ranks = list(per.values())
        if len(ranks) < 2 or any("t1" not in e for e in ranks) or not ranks[0]["ready"]:
            continue
        t0 = min(e["t0"] for e in ranks)
        m = {"backward end": max(e["bwd"] for e in ranks), "step end": max(e["t1"] for e in ranks)}
        for b in ranks[0]["ready"]:
            m[f"bucket {b} ready"] = max(e["ready"][b] for e in ranks)
            m[f"bucket {b} done"] = min(e["done"][b] for e in ranks)
        row = {k: (v - t0) / 1e6 for k, v in m.items()}
        if len(ranks[0]["ready"]) > 1:
            row.update(_after_first_hook([e["bwd"] - e["ready"][0] for e in ranks], 1e6))
        out.append(row)
    if not out:
        raise DagprofError("no hook records of bucket hooks in this strategy run's profile (a cmd: job's rounds have none)", run_dir)
    return out


def predicted_marks(folder: str, k: int, searched, strategy, link_model: str | None) -> list[dict[str, float]]:
    """The same marks on the replayed timeline of round ``k``'s profile of the defaults predicted under the strategy."""
    p = open_run(os.path.join(folder, "verify", f"round{k}-A", "run"))
    g = predict_run(p.run, p.graph, strategy, os.path.join(folder, "codec-costs.json"), searched.run, link_model).graph
    res = replay(g)
    out = []
    for s in sorted(set(g.step.tolist())):
        m = g.step == s
        enq = [v for v in np.flatnonzero(m & (g.kind == Kind.COMM_ENQUEUE) & (g.rank >= 0)) if ".enqueue" in g.node_name(v)]
        comm = np.flatnonzero(m & (g.kind == Kind.COMM) & (g.nbytes > 0))
        if not enq or not len(comm):
            continue
        t0 = res.start[m].min()
        marks = {"backward end": res.end[m & (g.kind == Kind.BACKWARD)].max(), "step end": res.end[m].max()}
        for b in sorted({int(g.bucket[v]) for v in enq}):
            marks[f"bucket {b} ready"] = max(res.start[v] for v in enq if g.bucket[v] == b)
        for b, v in enumerate(comm[np.argsort(res.start[comm])]):
            marks[f"bucket {b} done"] = res.end[v]
        row = {key: (v - t0) / 1e3 for key, v in marks.items()}
        row.update(_channel(g, res, comm))
        if len(comm) > 1:
            first = min(int(g.bucket[v]) for v in enq)
            row.update(_after_first_hook([res.end[m & (g.kind == Kind.BACKWARD) & (g.rank == r)].max()
                                          - min(res.start[v] for v in enq if g.bucket[v] == first and g.rank[v] == r)
                                          for r in sorted({int(g.rank[v]) for v in enq})], 1e3))
        out.append(row)
    return out


def measured_channel(run_dir: str) -> list[dict[str, float]]:
    """Per profiled step of a strategy run: each bucket's all-reduce as its own profile has it (the last rank's
    issue to the first rank's completion: transfers, callbacks, waits for the peer)."""
    g = open_run(run_dir).graph
    res = replay(g)
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.nbytes > 0))
    return [_channel(g, res, comm[g.step[comm] == s]) for s in sorted(set(g.step[comm].tolist()))]


def _channel(g, res, comm: np.ndarray) -> dict[str, float]:
    """ms on the channel per bucket of one step, buckets numbered by start (a first bucket's priced callbacks taken from
    the backward sit on its enqueue, before the all-reduce: compare the chained buckets after it)."""
    return {f"bucket {b} all-reduce": g.dur[v] / 1e3 for b, v in enumerate(comm[np.argsort(res.start[comm])])}


def _after_first_hook(spans: list[float], per_ms: float) -> dict[str, float]:
    """Per rank, the backward from the first bucket's hook (entered) to its end, the slowest and the fastest rank's:
    the backward the first bucket's callbacks ran beside, which the step waits for on its slowest rank."""
    return {"bwd after hook 0, slowest rank": max(spans) / per_ms, "bwd after hook 0, fastest rank": min(spans) / per_ms}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="a kept strategy folder: strategy.json, codec-costs.json, verify/roundK-A|B/run")
    ap.add_argument("--run", default=None, help="the searched profile (default: FOLDER/run, else FOLDER/../run)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    run = args.run or next((r for r in (os.path.join(args.folder, "run"), os.path.join(args.folder, os.pardir, "run")) if os.path.isdir(r)), None)
    if run is None:
        print(f"bench_powersgd_phases: no searched run beside {args.folder} (--run)", file=sys.stderr)
        return 2
    lm = os.path.join(os.path.dirname(os.path.abspath(run)), "link.json")
    meas: dict[str, list[float]] = {}
    pred: dict[str, list[float]] = {}
    k = 0
    try:
        strategy, searched = load_strategy(os.path.join(args.folder, "strategy.json")), open_run(run)
        while os.path.isdir(os.path.join(args.folder, "verify", f"round{k}-B")):
            b_run = os.path.join(args.folder, "verify", f"round{k}-B", "run")
            for into, rows in ((meas, measured_marks(b_run) + measured_channel(b_run)),
                               (pred, predicted_marks(args.folder, k, searched, strategy, lm if os.path.exists(lm) else None))):
                for row in rows:
                    for key, v in row.items():
                        into.setdefault(key, []).append(v)
            k += 1
    except DagprofError as err:
        print(f"bench_powersgd_phases: {err}", file=sys.stderr)
        return 2
    spans = ("all-reduce", "after hook")  # durations, after the marks on the step's timeline
    order = sorted(meas, key=lambda key: (any(w in key for w in spans), statistics.median(meas[key])))
    table = [{"mark": key, "measured_ms": statistics.median(meas[key]), "predicted_ms": statistics.median(pred[key]) if key in pred else None}
             for key in order]
    if args.json:
        print(json.dumps({"folder": args.folder, "rounds": k, "strategy": strategy.summary(), "marks": table}))
        return 0
    print(f"{strategy.summary()}: {k} rounds, medians over steps and rounds, ms from the step's start")
    for r in table:
        p = r["predicted_ms"]
        print(f"  {r['mark']:<30} measured {r['measured_ms']:7.1f}   predicted " + ("      -" if p is None else f"{p:7.1f}   ({p - r['measured_ms']:+.1f})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
