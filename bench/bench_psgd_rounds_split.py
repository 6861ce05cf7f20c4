"""PowerSGD's chain in kept strategy runs, split part by part against what the optimizer priced for each part (offline).

Each ``bench_optimize.py --keep`` folder's lossy verification rounds hold the strategy run's rank files (``roundK-B``),
whose records time each bucket's hook call (``Rec.ENQ_BEGIN``/``ENQ_END``), its three all-reduces' issues (the
uncompressed one inside the call, ``Rec.HOOK_COLL``; P and Q from the futures' callbacks, ``Rec.HOOK_LATE``; a later
bucket's all three from the callbacks) and the chain's completion (``Rec.COMM_DONE``). Both ranks ran on one host, so
their clocks compare: each part from one issue to the next is the wait for the later rank's issue (``lag``) plus, from the
last rank's issue, the all-reduce, the wake-up of the thread that runs the next callback and that callback's CPU. The
price of each part is the optimizer's (``passes.compression``: the link model's all-reduce plus the chained excess, the
codecs' CPU at ``Chained.callback_factor``), on the round's own profile of the defaults (``roundK-A``), as ``predict_run``
prices it; and per step the training thread's and gloo's threads' waits for a core (``traces.meta.StepSched``).

    python bench/bench_psgd_rounds_split.py /tmp/psgdpace/twotower /tmp/psgdcontend/embed ...   # each kept folder
    python bench/bench_psgd_rounds_split.py --json KEPT...
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

import numpy as np

from dagprof.closeloop import CODEC_COSTS_FILE
from dagprof.collect.deploy.strategy import load_strategy
from dagprof.passes.bucket_plan import BucketSlots
from dagprof.passes.compression import chained_latency_us, chained_line, powersgd_parts
from dagprof.passes.gradients import gradient_order
from dagprof.pipeline import open_run
from dagprof.search.measured import chained_in_job, codec_costs, in_job, job_overlap, or_calibrated, profiled_stretch, slowdown_in
from dagprof.traces.run_schema import Col, Rec

PARTS = ("hook", "unc", "p", "q")  # hook entered (a later bucket: the previous done) to the uncompressed issue; to P's; P to Q; Q to done
SKIP = 2  # the first profiled steps' chains: PowerSGD's warm-up (the strategy's start_iter) and the first compressed step


def priced(work: str, round_a: str, strategy_path: str) -> list[dict[str, float]]:
    """Per strategy bucket, each part's price in ms as ``predict_run`` prices the strategy on the round's profile."""
    searched = open_run(os.path.join(work, "run"))
    p = open_run(round_a)
    st = load_strategy(strategy_path)
    order = gradient_order(p.graph, p.run.ranks[0].buckets, p.run.ranks[0].meta.find_unused)
    job = job_overlap(searched.run)
    link = os.path.join(work, "link.json")
    cluster = or_calibrated(job, link if os.path.exists(link) else None)  # a cell searched without --link-model-calibrate has none
    c = st.compression
    costs = in_job(codec_costs(order, (c.rank,), os.path.join(os.path.dirname(strategy_path), CODEC_COSTS_FILE)).costs, job)
    chained = chained_in_job(cluster, profiled_stretch(p.run))
    beside = slowdown_in(cluster)[0]
    price = chained_line(chained, BucketSlots(p.graph, order).price)  # the line PowerSGD's all-reduces are priced on
    es = order.element_size
    at = {name: i for i, name in enumerate(order.params)}
    ends = sorted(max(at[q] for q in b.params) for b in st.buckets) if st.buckets else list(order.profiled_ends)
    out, first = [], 0
    for last in ends:
        last = int(last)
        pp = powersgd_parts(order, first, last, c.rank, costs)
        during = last < len(order) - 1
        lat = chained_latency_us(chained, price, during)
        f = (1.0 + beside) if during else chained.callback_factor
        sized = [at_size(chained.busy if during and chained.busy else chained.allreduce, price, b) for b in (pp.uncompressed * es, pp.p * es, pp.q * es)]
        out.append({"sized_lat_change": (sum(sized) - 3 * lat) / 1e3,
                    "hook": pp.issue_us * chained.cpu_factor / 1e3, "unc": (price(pp.uncompressed * es) + lat) / 1e3,
                    "p": (price(pp.p * es) + lat + pp.middle_us * f) / 1e3, "q": (price(pp.q * es) + lat + pp.decode_us * f) / 1e3,
                    "wire_unc": price(pp.uncompressed * es) / 1e3, "wire_p": price(pp.p * es) / 1e3, "wire_q": price(pp.q * es) / 1e3,
                    "lat": lat / 1e3, "middle": pp.middle_us * f / 1e3, "decode": pp.decode_us * f / 1e3, "during_backward": during,
                    "bytes": [pp.uncompressed * es, pp.p * es, pp.q * es]})
        first = last + 1
    return out


def at_size(table, price, nbytes: float) -> float:
    """The candidate not kept: calibrate's chained excess over the link model at the all-reduce's own size (linear in
    bytes between the measured sizes, the nearest one's outside them, never below 0) in place of the median over sizes."""
    if not table:
        return 0.0
    xs = [float(b) for b, _ in table]
    ys = [us - price(b) for b, us in table]
    return max(0.0, float(np.interp(nbytes, xs, ys)))


def chains(doc: dict) -> dict[tuple[int, int], dict[str, float]]:
    """(step, bucket) -> the chain's marks in ns on this rank: begin (hook entered), ret (its call returned), and the three
    issues unc / p / q, done; chains whose issues the records do not show as three are left out."""
    rec = np.asarray(doc["records"], np.int64)
    code, t = rec[:, Col.CODE], rec[:, Col.T_NS]
    steps = rec[code == Rec.STEP_BEGIN]
    step_of = lambda ns: int(steps[np.searchsorted(steps[:, Col.T_NS], ns, "right") - 1, Col.A]) if ns >= steps[0, Col.T_NS] else -1
    begin = {int(r[Col.B]): (int(r[Col.A]), int(r[Col.T_NS])) for r in rec[code == Rec.ENQ_BEGIN]}
    ret = {int(r[Col.B]): int(r[Col.T_NS]) for r in rec[code == Rec.ENQ_END]}
    done = {int(r[Col.B]): int(r[Col.T_NS]) for r in rec[code == Rec.COMM_DONE]}
    own = rec[np.isin(code, (Rec.HOOK_COLL, Rec.HOOK_BLOCKING))]
    late = np.sort(t[code == Rec.HOOK_LATE])
    out, prev_done = {}, 0
    for seq in sorted(done, key=done.get):
        if seq not in begin or seq not in ret:
            continue
        bucket, b0 = begin[seq]
        start = max(b0, prev_done)
        issues = sorted([int(x) for x in own[own[:, Col.B] == seq][:, Col.T_NS]]
                        + [int(x) for x in late[(late > start) & (late <= done[seq])]])
        prev_done = done[seq]
        if len(issues) != 3:
            continue
        out[(step_of(b0), bucket)] = {"begin": float(start), "ret": float(max(ret[seq], start)), "unc": float(issues[0]),
                                      "p": float(issues[1]), "q": float(issues[2]), "done": float(done[seq])}
    return out


def split_run(run_dir: str) -> dict[str, list[float]]:
    """Per bucket and part, the measured ms over the two ranks' chains (steps past ``SKIP``), each part as on each rank and
    the lag (the other rank issued later), plus per step the training thread's and other threads' wait for a core."""
    docs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(run_dir, "rank*.json")))]
    per = [chains(d) for d in docs]
    first_step = min(d["steps_profiled"][0] for d in docs) if docs[0]["steps_profiled"] else 0
    keys = sorted(set.intersection(*(set(c) for c in per)))
    out: dict[str, list[float]] = {}
    add = lambda k, v: out.setdefault(k, []).append(v)
    for step, bucket in keys:
        if step < first_step + SKIP:
            continue
        ms = [c[(step, bucket)] for c in per]
        b = f"b{bucket}"
        for m in ms:
            start = m["begin"]
            add(f"{b}.hook", (m["unc"] - start) / 1e6)
            add(f"{b}.unc", (m["p"] - m["unc"]) / 1e6)
            add(f"{b}.call", (m["ret"] - start) / 1e6)
            add(f"{b}.inline", float(m["ret"] > m["p"]))
            add(f"{b}.p", (m["q"] - m["p"]) / 1e6)
            add(f"{b}.q", (m["done"] - m["q"]) / 1e6)
            add(f"{b}.chain", (m["done"] - start) / 1e6)
            for part in ("unc", "p", "q"):
                add(f"{b}.lag_{part}", (max(x[part] for x in ms) - m[part]) / 1e6)
    for d in docs:
        for s, cpu, wait in d.get("thread_sched_ns", []):
            if s >= first_step + SKIP:
                add("train.wait", wait / 1e6)
                add("train.cpu", cpu / 1e6)
        for s, cpu, wait, runs in d.get("other_threads_ns", []):
            if s >= first_step + SKIP:
                add("gloo.wait", wait / 1e6)
                add("gloo.runs", float(runs))
                add("gloo.cpu", cpu / 1e6)
    return out


def cell(work: str) -> list[dict]:
    """Each lossy round of one kept workload folder: measured medians against the round's prices."""
    out = os.path.join(work, "lossy")
    strategy = os.path.join(out, "strategy.json")
    rows, k = [], 0
    while os.path.isdir(f"{out}/verify/round{k}-B"):
        f = f"{out}/verify/round{k}"
        try:
            price = priced(work, f"{f}-A/run", strategy)
        except Exception as e:  # noqa: BLE001 - a folder that cannot be priced says so and the rest go on
            print(f"{f}: not priced: {e}", file=sys.stderr)
            k += 1
            continue
        m = split_run(f"{f}-B/run")
        rows.append({"round": k, "priced": price, "measured": {key: statistics.median(v) for key, v in m.items() if v},
                     "n": {key: len(v) for key, v in m.items()}, "inline": {key: int(sum(v)) for key, v in m.items() if key.endswith(".inline")}})
        k += 1
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kept", nargs="+", help="bench_optimize --keep folders (each holds w*-* workload folders)")
    ap.add_argument("--json", default=None, help="write every round's figures here")
    args = ap.parse_args()
    every = {}
    for kept in args.kept:
        for work in sorted(glob.glob(os.path.join(kept, "w*-*"))):
            if not os.path.isdir(os.path.join(work, "lossy", "verify")):
                continue
            rows = cell(work)
            every[work] = rows
            print(work)
            for r in rows:
                m = r["measured"]
                print(f"  round {r['round']}: train wait {m.get('train.wait', 0):.1f} ms/step, gloo wait {m.get('gloo.wait', 0):.1f} "
                      f"({m.get('gloo.runs', 0):.0f} runs, cpu {m.get('gloo.cpu', 0):.1f})")
                for i, p in enumerate(r["priced"]):
                    b = f"b{i}"
                    if f"{b}.chain" not in m:
                        print(f"    bucket {i}: no chain recorded as three issues")
                        continue
                    cells = "  ".join(f"{part} {m[f'{b}.{part}']:.2f}/{p[part]:.2f}" for part in PARTS)
                    lags = " ".join(f"{m[f'{b}.lag_{part}']:.2f}" for part in ("unc", "p", "q"))
                    tot = sum(p[part] for part in PARTS)
                    print(f"    bucket {i} ({'in backward' if p['during_backward'] else 'after'}; n {r['n'][f'{b}.chain']}; "
                          f"inline {r['inline'][f'{b}.inline']}; sized-latency candidate {p['sized_lat_change']:+.2f}): "
                          f"measured/priced ms {cells}; chain {m[f'{b}.chain']:.2f}/{tot:.2f}; lags unc/p/q {lags}; "
                          f"wire {p['wire_unc']:.2f}/{p['wire_p']:.2f}/{p['wire_q']:.2f} + lat {p['lat']:.2f}, mid {p['middle']:.2f}, dec {p['decode']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(every, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
