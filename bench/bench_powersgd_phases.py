"""Where a PowerSGD strategy's measured step spends the time its prediction does not have, phase by phase.

Runs nothing: reads a kept strategy folder (the demo's ``dagprof-demo/``, or ``bench_optimize.py --keep``'s
``wI-R/lossy``) whose verification rounds were profiled by dagprof's hooks (our demo jobs; a ``cmd:`` job's rounds
carry no hook records and are refused in one line). Per round, the strategy run's own profile gives, on both ranks'
clock (one host: the namespace testbed), when each bucket's hook was entered on the later rank (ready), when the
earlier rank saw it complete (done), the backward's end and the step's end; the round's profile of the defaults,
predicted under the strategy as ``bench_optimize.py --repredict`` predicts it, gives the same marks on the replayed
timeline. Medians over steps and rounds, ms from the step's start; each span (a bucket's hook issue: entered to its first
all-reduce, the slowest rank's; its all-reduce; the backward after the first hook) with its measured 10th percentile,
how far the price is from the run's better steps (a first bucket's predicted issue holds the callbacks' CPU the
prediction takes from the backward; where a rank's first all-reduce had completed before torch's hook chained its
callbacks, the whole chain ran inline on the training thread, the issue holding it and the all-reduce nothing: in a
run at load 3, 23.5 ms of hook issue at the median against 3.2 in the quiet one):

    .venv/bin/python bench/bench_powersgd_phases.py KEPT_STRATEGY_FOLDER [--run SEARCHED_RUN] [--per-round] [--json]

On the kept quiet runs (2 ranks, 200 Mbit/s, load about 1.5), predicted minus measured: the compute before the first
bucket is predicted 0-6 ms slow in every cell (the defaults' profile keeps contention the overlap slowdown does not
take out: the demo's rank 1 ran ``layers.7.conv1``'s backward in 15.8 ms (median) beside DDP's buckets, 3.8 ms in the
strategy run, predicted 10.5), and PowerSGD's chains (ready to done) are predicted short: a single bucket after the
backward by 0.4 (mlp), 5.0 (conv), 1.9 (LSTM), 1.1 and 4.0 ms (embedding; its second run's codec costs put the hook's
CPU at 3.9 ms against 6.3 in the first, the same shapes); the first of two buckets, its callbacks beside the
backward, by 5.3 (demo) and 6.8 ms (cnn), +1.1 (transformer), and within 0.6 ms, +4.4 in the transformer, once they
are priced as running beside it (``passes.compression``); after it the demo's last bucket took 12.6 ms against 7.0,
and the cnn's backward ended 12.4 ms later than predicted. The cells within 5 % are these misses cancelling.

With two buckets it also sets, per rank, the backward after the first bucket's hook was entered (its span, and its own
ops summed: the rest is the hook on the training thread and waits) and each bucket's all-reduce as the strategy run's
profile has it (the last rank's issue to the first completion). On the built-in cnn's kept two-bucket strategy
(``bench_optimize.py --workloads cnn,mlp,transformer --keep``'s ``w0-2/lossy``, 3 rounds), predicted minus measured: the ops after the first hook
-11.7 ms on the fastest rank (9.8 against 21.5) and -19.9 on the slowest (13.0 against 32.9); the first hook on the
training thread priced 10.5 ms (issue and the callbacks' CPU taken from the backward) where the issue took about 6;
the chained second bucket's all-reduce -4.8 ms (2.3 against 7.2; the LSTM's -2.8, 4.3 against 7.1). The ops after the
hook ran 16.6-19.5 ms in the defaults' profile (rounds 2-3), where that profile's replay has DDP's large bucket in
flight beside them: the overlap slowdown takes about a third out of them (11.3 predicted), yet the strategy run's
fastest rank took 17.2-18.8 there, and the ops before the hook (32.5-36.4 measured, 33.9-37.9 predicted) show the
slowdown taken out right. The rest is the first bucket's callbacks beside the backward, unevenly: per step one rank's
ops after the hook took 13-20 ms more than the other's when the ranks issued the bucket within 2 ms of each other
(the callbacks' CPU priced 5.3 ms per rank); the LSTM's two buckets (2.4 ms of callbacks beside one op) lose about
what is priced on both ranks.

``--cycle`` splits a step's period instead, from one sync (the later rank's first all-reduce issued) to the next,
along the rank that reached the next sync last: to its last completion (the chain), to its step's end (finalize, the
optimizer), to its next hook, and that hook's issue. On the held-out embedding job's kept rounds (2026-12-04 13:28,
load 1.8-4.4, one bucket), rounds 1 and 3, measured medians against predicted: period 38.8 / 37.8 against 32.7 /
29.5 ms; the chain 17.1 / 16.3 against 16.3 / 16.3; the issue 4.3 / 4.3 against 2.3 / 2.2; to the step's end 8.8 /
10.6 against 6.8 / 5.6 (its Adam took 5-6 ms per rank against 3.5-6 in the defaults' runs, 13 ms more on one rank in
some steps); the forward and backward 5.6 / 6.3 against 6.3 / 5.1. The small all-reduces and the callbacks between
them were priced within 1 ms; the miss was CPU on either side. The held-out LSTM's (load 3.6-6): chain 12.6-13.3
against 12.3, issue 3.8-12.1 against 2.3-2.7, its forward and backward swinging with the load (53-182 ms against 97-104).
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
                step, ev = a, {"t0": t, "ready": {}, "issued": {}, "done": {}, "bwd": t}
                steps.setdefault(step, {})[rf["rank"]] = ev
            elif step is None:
                continue
            elif code == Rec.STEP_END:
                ev["t1"] = t
            elif code == Rec.ENQ_BEGIN:
                ev["ready"][a] = t
            elif code == Rec.ENQ_END:
                ev["issued"][a] = t
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
        for b in ranks[0]["ready"]:  # the hook on the thread that called it, to its first all-reduce: the slowest rank's
            if all(b in e["issued"] for e in ranks):
                row[f"bucket {b} hook issue"] = max(e["issued"][b] - e["ready"][b] for e in ranks) / 1e6
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
        issue = {f"bucket {b} hook issue": max(g.dur[v] for v in enq if g.bucket[v] == b) / 1e3 for b in sorted({int(g.bucket[v]) for v in enq})}
        for b, v in enumerate(comm[np.argsort(res.start[comm])]):
            marks[f"bucket {b} done"] = res.end[v]
        row = {key: (v - t0) / 1e3 for key, v in marks.items()}
        row.update(issue)
        row.update(_channel(g, res, comm))
        row.update(_ops_after_first_hook(g, res, s))
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
    return [{**_channel(g, res, comm[g.step[comm] == s]), **_ops_after_first_hook(g, res, s)} for s in sorted(set(g.step[comm].tolist()))]


def _channel(g, res, comm: np.ndarray) -> dict[str, float]:
    """ms on the channel per bucket of one step, buckets numbered by start (a first bucket's priced callbacks taken from
    the backward sit on its enqueue, before the all-reduce: compare the chained buckets after it)."""
    return {f"bucket {b} all-reduce": g.dur[v] / 1e3 for b, v in enumerate(comm[np.argsort(res.start[comm])])}


def _ops_after_first_hook(g, res, step: int) -> dict[str, float]:
    """The backward's own ops after the first bucket's hook was entered, summed per rank (slowest and fastest rank):
    what the backward after the hook spends in ops, the rest being the hook on the training thread and waits. Empty
    with one bucket (the hook comes after the backward)."""
    enq = np.flatnonzero((g.kind == Kind.COMM_ENQUEUE) & (g.rank >= 0) & (g.step == step) & (g.bucket == 0) & (g.dur > 1.0))
    bwd = np.flatnonzero((g.kind == Kind.BACKWARD) & (g.step == step))
    if len(np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.step == step) & (g.nbytes > 0))) < 2 or not len(enq):
        return {}
    sums = [g.dur[bwd[(g.rank[bwd] == g.rank[v]) & (res.start[bwd] >= res.start[v])]].sum() / 1e3 for v in enq]
    return {"bwd ops after hook 0, slowest rank": max(sums), "bwd ops after hook 0, fastest rank": min(sums)}


def _after_first_hook(spans: list[float], per_ms: float) -> dict[str, float]:
    """Per rank, the backward from the first bucket's hook (entered) to its end, the slowest and the fastest rank's:
    the backward the first bucket's callbacks ran beside, which the step waits for on its slowest rank."""
    return {"bwd after hook 0, slowest rank": max(spans) / per_ms, "bwd after hook 0, fastest rank": min(spans) / per_ms}


CYCLE = ("sync to done", "done to step end", "step end to hook", "hook issue")  # ``cycle``'s segments, in order


def cycle(marks: list[dict[int, dict[str, float]]]) -> dict[str, list[float]]:
    """From one step's sync to the next's (the later rank's first all-reduce issued: both ranks are at the chain's first
    all-reduce there), along the rank that was the later one at the next sync: to its last bucket's completion, to its
    step's end (DDP's finalize, the optimizer), to its next first hook (the forward and the backward before it) and that
    hook's issue. The four add up to the cycle, a step's period in steady state; ``marks``: per step, per rank, ns or us."""
    out: dict[str, list[float]] = {"cycle": []}
    for now, nxt in zip(marks, marks[1:]):
        if set(now) != set(nxt) or len(now) < 2:
            continue
        sync = max(e["issued"] for e in now.values())
        r = max(nxt, key=lambda q: nxt[q]["issued"])
        a, b = now[r], nxt[r]
        for key, v in zip(CYCLE + ("cycle",), (a["done"] - sync, a["end"] - a["done"], b["ready"] - a["end"], b["issued"] - b["ready"],
                                                b["issued"] - sync)):
            out.setdefault(key, []).append(v)
    return out


def measured_cycle(run_dir: str) -> dict[str, list[float]]:
    """``cycle`` over a strategy run's profiled steps, ms (its hook records: the first hook entered and issued, the last
    completion, the step's end)."""
    per: dict[int, dict[int, dict[str, float]]] = {}
    for f in sorted(f for f in os.listdir(run_dir) if f.startswith("rank") and f.endswith(".json")):
        rf = json.load(open(os.path.join(run_dir, f)))
        step = None
        for code, a, _b, t, _x in rf["records"]:
            if code == Rec.STEP_BEGIN:
                step, e = a, {}
                per.setdefault(step, {})[rf["rank"]] = e
            elif step is None:
                continue
            elif code == Rec.ENQ_BEGIN:
                e.setdefault("ready", t / 1e6)
            elif code == Rec.ENQ_END:
                e.setdefault("issued", t / 1e6)
            elif code == Rec.COMM_DONE:
                e["done"] = t / 1e6
            elif code == Rec.STEP_END:
                e["end"] = t / 1e6
    return cycle([{r: e for r, e in per[s].items() if len(e) == 4} for s in sorted(per)])


def predicted_cycle(folder: str, k: int, searched, strategy, link_model: str | None) -> dict[str, list[float]]:
    """``cycle`` on the replayed timeline of round ``k``'s defaults profile predicted under the strategy, ms."""
    p = open_run(os.path.join(folder, "verify", f"round{k}-A", "run"))
    g = predict_run(p.run, p.graph, strategy, os.path.join(folder, "codec-costs.json"), searched.run, link_model).graph
    res = replay(g)
    marks = []
    for s in sorted(set(g.step.tolist()) - {-1}):
        m = g.step == s
        comm = np.flatnonzero(m & (g.kind == Kind.COMM) & (g.nbytes > 0))
        per = {}
        for r in sorted(set(g.rank[m].tolist()) - {-1}):
            enq = [v for v in np.flatnonzero(m & (g.kind == Kind.COMM_ENQUEUE) & (g.rank == r)) if ".enqueue" in g.node_name(v)]
            if enq and len(comm):
                v = min(enq, key=lambda u: res.start[u])
                per[r] = {"ready": res.start[v] / 1e3, "issued": res.end[v] / 1e3, "done": res.end[comm].max() / 1e3,
                          "end": res.end[m & (g.rank == r)].max() / 1e3}
        marks.append(per)
    return cycle(marks)


def table(meas: dict[str, list[float]], pred: dict[str, list[float]]) -> list[dict]:
    """Marks, then spans, each by its measured median: measured median and 10th percentile, predicted median."""
    spans = ("all-reduce", "after hook", "hook issue")  # durations, after the marks on the step's timeline
    order = sorted(meas, key=lambda key: (any(w in key for w in spans), statistics.median(meas[key])))
    return [{"mark": key, "measured_ms": statistics.median(meas[key]), "measured_p10_ms": float(np.percentile(meas[key], 10)),
             "predicted_ms": statistics.median(pred[key]) if key in pred else None, "span": any(w in key for w in spans)} for key in order]


def print_cycles(folder: str, searched, strategy, link_model: str | None, as_json: bool) -> int:
    """``--cycle``: per round, each segment's median (and 90th percentile) measured against its predicted median."""
    rows = []
    while os.path.isdir(os.path.join(folder, "verify", f"round{len(rows)}-B")):
        k = len(rows)
        me, pr = measured_cycle(os.path.join(folder, "verify", f"round{k}-B", "run")), predicted_cycle(folder, k, searched, strategy, link_model)
        rows.append({key: {"measured_ms": statistics.median(me[key]), "measured_p90_ms": float(np.percentile(me[key], 90)),
                           "predicted_ms": statistics.median(pr[key]) if pr.get(key) else None} for key in CYCLE + ("cycle",) if me.get(key)})
    if as_json:
        print(json.dumps({"folder": folder, "strategy": strategy.summary(), "cycle_per_round": rows}))
        return 0
    print(f"{strategy.summary()}: per round, a step's period between the chain's syncs on the rank that reached the next one last; "
          "ms, measured median (p90) against predicted median")
    for k, row in enumerate(rows):
        print(f" round {k + 1}: " + "; ".join(f"{key} {v['measured_ms']:.1f} ({v['measured_p90_ms']:.1f}) vs "
                                            + ("-" if v["predicted_ms"] is None else f"{v['predicted_ms']:.1f}") for key, v in row.items()))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="a kept strategy folder: strategy.json, codec-costs.json, verify/roundK-A|B/run")
    ap.add_argument("--run", default=None, help="the searched profile (default: FOLDER/run, else FOLDER/../run)")
    ap.add_argument("--per-round", action="store_true", help="a table per round too: a round's miss beside its own runs' load")
    ap.add_argument("--cycle", action="store_true", help="instead of the marks: a step's period between the chain's syncs, by segment "
                    "of the rank that reached the next sync last (``cycle``), per round, measured against predicted")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    run = args.run or next((r for r in (os.path.join(args.folder, "run"), os.path.join(args.folder, os.pardir, "run")) if os.path.isdir(r)), None)
    if run is None:
        print(f"bench_powersgd_phases: no searched run beside {args.folder} (--run)", file=sys.stderr)
        return 2
    lm = os.path.join(os.path.dirname(os.path.abspath(run)), "link.json")
    rounds: list[tuple[dict[str, list[float]], dict[str, list[float]]]] = []  # per round: (measured, predicted) per mark
    try:
        strategy, searched = load_strategy(os.path.join(args.folder, "strategy.json")), open_run(run)
        if args.cycle:
            return print_cycles(args.folder, searched, strategy, lm if os.path.exists(lm) else None, args.json)
        while os.path.isdir(os.path.join(args.folder, "verify", f"round{len(rounds)}-B")):
            k, b_run = len(rounds), os.path.join(args.folder, "verify", f"round{len(rounds)}-B", "run")
            rounds.append(({}, {}))
            for into, rows in ((rounds[k][0], measured_marks(b_run) + measured_channel(b_run)),
                               (rounds[k][1], predicted_marks(args.folder, k, searched, strategy, lm if os.path.exists(lm) else None))):
                for row in rows:
                    for key, v in row.items():
                        into.setdefault(key, []).append(v)
    except DagprofError as err:
        print(f"bench_powersgd_phases: {err}", file=sys.stderr)
        return 2
    every = [{key: [v for r in rounds for v in r[i].get(key, [])] for key in {k for r in rounds for k in r[i]}} for i in (0, 1)]
    tables = [("all rounds", table(*every))] + ([(f"round {k + 1}", table(*r)) for k, r in enumerate(rounds)] if args.per_round else [])
    if args.json:
        print(json.dumps({"folder": args.folder, "rounds": len(rounds), "strategy": strategy.summary(), "marks": tables[0][1],
                          "per_round": [t for _, t in tables[1:]]}))
        return 0
    print(f"{strategy.summary()}: {len(rounds)} rounds, medians over steps, ms from the step's start (spans: their 10th percentile too)")
    for name, rows in tables:
        print(f" {name}:")
        for r in rows:
            p = r["predicted_ms"]
            p10 = f" (p10 {r['measured_p10_ms']:5.1f})" if r["span"] else " " * 12
            priced = "      -" if p is None else f"{p:7.1f}   ({p - r['measured_ms']:+.1f})"
            print(f"  {r['mark']:<30} measured {r['measured_ms']:7.1f}{p10}   predicted {priced}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
