"""TF's padded all-gathers of sparse gradients on more workers: predicted from N0-worker profiles against N-worker runs.

``tf_recsys_ragged.py``, ``tf_textcls_buckets.py`` and ``tf_skipgram_negative.py`` (``bench_frameworks.py --keep``)
all-gather their tables' sparse gradients in TF's branch that pads every worker's rows to the most any has
(``cond/else/``), or, in a step whose workers had equal rows, in the branch without padding (``cond/then/``). For each
profiled run of N0 workers this prices those gathers on N workers (``passes.workers.scale_workers``, N the measured runs'
worker count, same per-worker batch) and holds their bytes per step (summed over both branches' gathers, over the steps)
against the N-worker runs' own, as their reader sized them from every worker's count (``tf_gather_rows.py`` checks those
against the scripts' logs). With ``--step``, also ``whatif --workers N``'s step against each N-worker run's measured
one (on 2 shared cores, 4 workers contend for cores the what-if gives each: a figure to read with that in mind).
Runs with whatever dagprof is on ``PYTHONPATH`` (another tree's ``src`` gives its "before").

    PYTHONPATH=src python bench/frameworks/tf_padded_workers.py --profiled R2A R2B --measured R4A R4B [--step] [--json]
"""
from __future__ import annotations

import argparse
import json
import re
import sys

import numpy as np

from dagprof.passes.link_fit import graph_world_size
from dagprof.passes.workers import scale_workers
from dagprof.pipeline import open_run
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.events import CommRole, Kind

_BRANCH = re.compile(r"(?:^|/)cond(?:_\d+)?/(?:then|else)/")  # TF's two branches: equal rows a worker, or padded to the most


def padded_bytes_per_step(g) -> float:
    """The sparse gradients' all-gathers of either branch (a step whose workers had equal rows takes the branch without
    padding; on more workers it may pad): their bytes summed, over the graph's steps."""
    sel = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.role == CommRole.SPARSE))
    sel = [v for v in sel.tolist() if _BRANCH.search(g.names[int(g.name[v])])]
    return float(sum(int(g.nbytes[v]) for v in sel)) / max(len(g.meta.steps), 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiled", nargs="+", required=True)
    ap.add_argument("--measured", nargs="+", required=True)
    ap.add_argument("--step", action="store_true", help="also whatif --workers N's step against the N-worker runs' measured step")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    measured = []
    for run in args.measured:
        p = open_run(run)
        measured.append({"run": run, "workers": graph_world_size(p.graph), "padded_bytes": padded_bytes_per_step(p.graph),
                         "measured_ms": (p.analysis.measured_us or float("nan")) / 1e3, "replay_pct": p.analysis.error_pct})
    workers = {m["workers"] for m in measured}
    if len(workers) != 1:
        raise SystemExit(f"the measured runs have {sorted(workers)} workers: give runs of one worker count")
    n = workers.pop()
    predicted = []
    for run in args.profiled:
        p = open_run(run)
        row = {"run": run, "workers": graph_world_size(p.graph), "profiled_padded_bytes": padded_bytes_per_step(p.graph),
               "padded_bytes": padded_bytes_per_step(scale_workers(p.graph, n))}
        if args.step:
            r = evaluate(p.graph, [Scenario(workers=n)], measured_us=p.analysis.measured_us, tolerance_pct=None)
            row["predicted_ms"] = r["scenarios"][0].predicted_iter_ms
        predicted.append(row)
    pred = float(np.mean([r["padded_bytes"] for r in predicted]))
    meas = float(np.mean([m["padded_bytes"] for m in measured]))
    out = {"workers": n, "predicted_padded_bytes": pred, "measured_padded_bytes": meas,
           "error_pct": 100.0 * (pred - meas) / meas if meas else None, "profiled": predicted, "measured": measured}
    if args.step:
        steps = [r["predicted_ms"] for r in predicted if r.get("predicted_ms")]
        out["step_error_pct"] = (100.0 * (np.mean(steps) - np.mean([m["measured_ms"] for m in measured])) /
                                 np.mean([m["measured_ms"] for m in measured])) if steps else None
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for r in predicted:
            print(f"profiled {r['run']} ({r['workers']} workers): {r['profiled_padded_bytes']:.0f} B/step -> {n} workers "
                  f"{r['padded_bytes']:.0f}" + (f", step {r['predicted_ms']:.1f} ms" if r.get("predicted_ms") else ""))
        for m in measured:
            print(f"measured {m['run']}: {m['padded_bytes']:.0f} B/step, step {m['measured_ms']:.1f} ms (replay {m['replay_pct']:+.2f} %)")
        print(f"padded gathers per step at {n} workers: predicted {pred:.0f} B, measured {meas:.0f} B ({out['error_pct']:+.2f} %)"
              + (f"; step {out['step_error_pct']:+.1f} %" if out.get("step_error_pct") is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
