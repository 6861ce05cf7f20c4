"""How much each backward op's time differs beside an all-reduce and with nothing beside it, on kept optimizer runs.

Runs nothing: reads ``bench_optimize.py --keep`` folders. Each verification round holds a profile of DDP's defaults
(A) and one of the strategy (B), taken back to back on the same ranks; an op (rank, name) that the A run's replay
has beside a bucket's all-reduce for most of its time and the B run's beside nothing gives the pair. Per pair: the
per-step medians' ratio A / B, the overlapped share and where the op started relative to the all-reduce it overlapped
(A's replayed timeline), against what ``passes.overlap`` assumes (1 + s f, s the cell's ``calibrate --overlap``):

    .venv/bin/python bench/bench_overlap_ops.py KEPT [KEPT ...] [--json]

On the kept quiet runs of 2026-12-02 (``bench_optimize.py --keep``: optbuiltin, optcnn2, optcnn3, optlstm, optconv,
optembed; 2 ranks, 200 Mbit/s; the pairs are the lossy cells' but one) the model charges 1 + s = 1.74-2.34 for an op
wholly beside a bucket (each moves at the link's rate: the optimizer's weight is 1). Ops that started 10 ms or more
after the all-reduce did ran 0.98-1.07x (median over pairs; lstm's 2 ops 2.0x) their time with nothing beside them,
1.13-1.38x summed (a few stalled steps and ranks); those that started within its first 10 ms 1.0-2.7x, 1.1-2.8x
summed: rank 1 of the cnn's defaults ran ``layers.7.conv1`` in 17.7 ms, 4.0 in the strategy run. The excess is single
ops stalled, most at an all-reduce's start, not a slowdown spread over the overlap; per step, on the cnns' kept
cells, 0-10 ms on one rank and 28-31 ms on the other (8-28 ms per rank in mlp/transformer), where the model takes
s / (1 + s), about half, of every overlapped op on both. The buckets all moved at the link's rate (1.0-2.3 MiB,
demand 1), so these runs cannot show a dependence on the message size or rate. Re-predicted offline
(``bench_optimize.py --repredict``), charging s only over an all-reduce's first 10 ms took the built-in cnn from
+19.8 to -2.0 % but the lossy mlp, transformer, cnn3, conv and lstm cells to -16 to -27 %; pooling an op's steps
by their median (or leaving out steps over 3x it) took the cnn cells further off (+25.6 %; cnn3 +2.1 to +9.3 %).
Neither landed.

Each pair is also read against a control of its own round and rank (``--control``, the default): the rank's forward and
optimizer ops, which under DDP run with no collective in flight in either run (the optimizer waits for every bucket), A
over B summed over the median step. Beside over control is then the op's slowdown from the collective beside it, the
machine's pace in each run taken out; per cell also the training thread's run-queue wait and its process's other
threads' CPU (gloo's, mostly) per step, A and B (``collect.hooks.thread_sched``). On the 14 kept PowerSGD folders of
2026-12-05/06 (docs/evidence.md, branch psgdcontend), quiet rounds: the control 1.05-1.34 in the 6 embedding cells (median
1.20; a tied-embedding LM among them) against 0.80-1.10 in the 12 conv, LSTM and encoder cells (median 1.03), with the
embeddings' training threads waiting 0.3-0.5 ms a step; each pair over its control 1.09-1.45 against 1 + s 1.11-1.60.
The embeddings' strategy computes faster as a whole, not where the collective was beside it.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

import numpy as np

from dagprof.collect.measure.overlap import Overlap, load_overlap, overlap_from_table
from dagprof.errors import DagprofError
from dagprof.passes.overlap import comm_demand, comm_overlap, slowed_nodes
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.events import Kind, Run

QUIET = 0.15  # a round whose training threads waited for a core under this share of their CPU, in both runs, is a quiet one
EARLY_MS = 10.0  # an op that started this soon after the all-reduce it overlaps counts as at its start


CONTROL = (Kind.FORWARD, Kind.UPDATE)  # DDP runs them with no collective in flight: the run's pace alone


def op_times(run_dir: str, rate: float | None) -> tuple[dict[tuple[int, str], tuple[float, float, float]], dict[int, float], dict[str, float]]:
    """Per (rank, op name) of a profiled run's backward: the median over steps of its duration (us), of its overlapped
    share (each collective weighted as the optimizer weighs it) and of how long after the start of the latest
    all-reduce in flight it started (ms; nan: none in flight). Then per rank its control (``CONTROL`` ops with nothing
    in flight, summed over the step, the median step, us) and the run's schedstat per step (``median_sched``)."""
    p = open_run(run_dir)
    g = p.graph
    res = replay(g)
    ctrl = slowed_nodes(g)
    ctrl = ctrl[(g.step[ctrl] >= 0) & np.isin(g.kind[ctrl], [int(k) for k in CONTROL])]
    ctrl = ctrl[comm_overlap(g, res, ctrl) < 0.1]
    control = {int(r): float(np.median([g.dur[ctrl[(g.rank[ctrl] == r) & (g.step[ctrl] == s)]].sum() for s in set(g.step[ctrl[g.rank[ctrl] == r]].tolist())]))
               for r in set(g.rank[ctrl].tolist())}
    nodes = slowed_nodes(g)
    nodes = nodes[(g.step[nodes] >= 0) & (g.kind[nodes] == int(Kind.BACKWARD))]
    f = comm_overlap(g, res, nodes, None if rate is None else comm_demand(g, res, g.nbytes.astype(float), rate))
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.dur > 0))
    order = np.argsort(res.start[comm], kind="stable")
    cs, ce = res.start[comm][order], res.end[comm][order]
    j = np.searchsorted(cs, res.end[nodes]) - 1
    inflight = (j >= 0) & (ce[np.maximum(j, 0)] > res.start[nodes])
    since = np.where(inflight, (res.start[nodes] - cs[np.maximum(j, 0)]) / 1e3, np.nan)
    per: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    for i, n in enumerate(nodes):
        per.setdefault((int(g.rank[n]), g.names[g.name[n]].split(".", 1)[-1]), []).append((float(g.dur[n]), float(f[i]), float(since[i])))
    out = {}
    for k, v in per.items():
        a = np.array(v)
        out[k] = (float(np.median(a[:, 0])), float(np.median(a[:, 1])), float(np.nanmedian(a[:, 2])) if np.isfinite(a[:, 2]).any() else float("nan"))
    return out, control, median_sched(p.run)


def median_sched(run: Run) -> dict[str, float]:
    """The median profiled step over ranks (ms): the training thread's CPU and run-queue wait, and its process's CPU on
    other threads (gloo's, the profiler's); nan where not recorded."""
    rows = [(x.cpu_us, x.wait_us, own) for t in run.ranks for x in t.meta.train_thread if (own := x.off_thread_cpu_us) is not None]
    med = np.median(np.array(rows), axis=0) / 1e3 if rows else np.full(3, np.nan)
    return {"cpu_ms": float(med[0]), "wait_ms": float(med[1]), "others_ms": float(med[2])}


def cell_overlap(cell: str) -> Overlap:
    """The overlap the cell's search priced with: its calibrated link model's, else the one beside its profile."""
    link = os.path.join(cell, "link.json")
    table = json.load(open(link)).get("overlap") if os.path.exists(link) else None
    ov = overlap_from_table(table, link) if table else load_overlap(os.path.join(cell, "run"))
    if ov is None:
        raise DagprofError("no overlap measurement (link.json's or run/overlap.json)", cell)
    return ov


def cell_pairs(cell: str) -> tuple[float, list[dict], list[dict]]:
    """The cell's measured slowdown, its (op, round) pairs: beside an all-reduce in A (share over 0.5), beside
    nothing in B (under 0.1), at least 0.3 ms with nothing beside, each with its rank's control A / B; and per round
    the schedstat of A and of B (``median_sched``)."""
    ov = cell_overlap(cell)
    rows, rounds = [], []
    for a in sorted(glob.glob(os.path.join(cell, "*", "verify", "round*-A"))):
        mode = a.split(os.sep)[-3]
        (A, ca, sa), (B, cb, sb) = op_times(os.path.join(a, "run"), ov.rate), op_times(os.path.join(a[:-1] + "B", "run"), ov.rate)
        rounds.append({"mode": mode, "round": os.path.basename(a)[:-2], "A": sa, "B": sb,
                       "control": statistics.median(ca[r] / cb[r] for r in ca.keys() & cb.keys() if cb[r] > 0) if ca.keys() & cb.keys() else None})
        for k, (da, fa, since) in A.items():
            if k in B and fa > 0.5 and B[k][1] < 0.1 and B[k][0] > 300:
                rows.append({"mode": mode, "round": os.path.basename(a)[:-2], "rank": k[0], "op": k[1], "beside_ms": da / 1e3,
                             "alone_ms": B[k][0] / 1e3, "overlapped": fa, "started_after_ms": since,
                             "control": ca[k[0]] / cb[k[0]] if k[0] in ca and cb.get(k[0], 0) > 0 else None})
    return ov.model_slowdown, rows, rounds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kept", nargs="+", help="bench_optimize.py --keep folders (their wI-R cells are read)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table = []
    try:
        for kept in args.kept:
            for cell in sorted(glob.glob(os.path.join(kept, "w*-*"))):
                s, rows, rounds = cell_pairs(cell)
                for mode in sorted({r["mode"] for r in rounds}):
                    sub = [r for r in rows if r["mode"] == mode]
                    line = {"cell": f"{os.path.basename(kept.rstrip(os.sep))}/{os.path.basename(cell)}", "mode": mode, "s": s, "pairs": sub,
                            "rounds": [r for r in rounds if r["mode"] == mode]}
                    for part, pick in (("early", lambda r: r["started_after_ms"] < EARLY_MS), ("later", lambda r: r["started_after_ms"] >= EARLY_MS)):
                        p = [r for r in sub if pick(r)]  # nan (no all-reduce in flight at the start) is in neither
                        line[part] = {"n": len(p), "median_ratio": statistics.median(r["beside_ms"] / r["alone_ms"] for r in p) if p else None,
                                      "sum_ratio": sum(r["beside_ms"] for r in p) / sum(r["alone_ms"] for r in p) if p else None}
                    both = [r for r in sub if r["control"]]
                    line["over_control"] = statistics.median(r["beside_ms"] / r["alone_ms"] / r["control"] for r in both) if both else None
                    controls = [r["control"] for r in line["rounds"] if r["control"]]
                    line["control"] = statistics.median(controls) if controls else None
                    quiet = [r["control"] for r in line["rounds"] if r["control"] and all(r[x]["wait_ms"] < QUIET * r[x]["cpu_ms"] for x in "AB")]
                    line["control_quiet"], line["quiet_rounds"] = statistics.median(quiet) if quiet else None, len(quiet)
                    for side in "AB":
                        line[side] = {k: statistics.median(r[side][k] for r in line["rounds"]) for k in ("cpu_ms", "wait_ms", "others_ms")}
                    table.append(line)
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench_overlap_ops: {e}") from None
    except DagprofError as e:
        raise SystemExit(str(e)) from None
    if not table:
        raise SystemExit(f"bench_overlap_ops: no kept cell with verification rounds in {' '.join(args.kept)}")
    if args.json:
        json.dump({"cells": table}, sys.stdout)
        return 0
    print(f"per op, beside the all-reduce (A) over alone (B): started within its first {EARLY_MS:.0f} ms / later; model 1 + s")
    print("then the rank's control (forward and optimizer, nothing in flight) A / B, all rounds and quiet ones (the training threads "
          f"waited under {100 * QUIET:.0f} % of their CPU in both runs), every pair over its control (median), and per step the "
          "training thread's CPU / run-queue wait / other threads' CPU (ms), A | B, medians over rounds")
    print(f"{'cell':22s} {'mode':8s} {'1+s':>5s} {'n':>4s} {'early med':>9s} {'sum':>6s} {'n':>4s} {'later med':>9s} {'sum':>6s} "
          f"{'control':>7s} {'quiet':>10s} {'/ctrl':>6s}  sched A | B")

    def fmt(x):
        return f"{x:.3f}" if x is not None else "-"
    for t in table:
        e, lt = t["early"], t["later"]
        sa, sb = (" / ".join(f"{t[x][k]:.1f}" for k in ("cpu_ms", "wait_ms", "others_ms")) for x in "AB")
        print(f"{t['cell']:22s} {t['mode']:8s} {1 + t['s']:5.2f} {e['n']:4d} {fmt(e['median_ratio']):>9s} {fmt(e['sum_ratio']):>6s} "
              f"{lt['n']:4d} {fmt(lt['median_ratio']):>9s} {fmt(lt['sum_ratio']):>6s} {fmt(t['control']):>7s} "
              f"{fmt(t['control_quiet']):>5s} ({t['quiet_rounds']}/{len(t['rounds'])}) {fmt(t['over_control']):>6s}  {sa} | {sb}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
