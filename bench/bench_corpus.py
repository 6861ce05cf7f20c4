"""Every public trace through replay: does it replay, how close, and where it departs (issue 9).

Reads every trace file and rank folder under ``<data>/kineto-public`` and ``<data>/kineto-corpus``
(a folder whose files are distinct ranks of one job is one run; a folder holding several runs of
the same worker is one row per file). Each row: ranks, steps, measured and replayed iteration,
error, or the one-line reason it is refused; then where the replay departs first (``--explain``)
and, over the whole corpus, how many inferred edges per rule the measured timelines contradict.

Rows are grouped as the rules were developed: ``dev`` (kineto-public, the TensorBoard samples,
param's single traces and the docs/inference captures) and ``held-out`` (TraceLens H100/MI300,
B200 and the 8-rank DLRM set, kept aside until the rules were final). The summary line takes
training traces with complete steps (ProfilerStep or ``--step-marker`` iterations, backward ops
present): median and max |error| per group; a trace replayed as one profiled window is listed but
not a "complete step".

Replay keeps every op's measured duration and gap, so on the measured configuration the "error"
column is zero whenever no inferred edge is false: it checks the edges, not a prediction. The
"averaged" column is one: every op at its mean over the profiled steps (dPRO's averaged replay),
so no step's own times feed its prediction; traces with more than one step only.

    python bench/bench_corpus.py [--data ../shared/data] [--json] [--threshold-us 100]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dagprof.analysis import analyze
from dagprof.analysis.explain import departure_line, explain
from dagprof.errors import DagprofError
from dagprof.graph.provenance import violations
from dagprof.passes.average_steps import average_steps
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.events import Kind
from dagprof.traces.kineto_dir import read_cached, trace_files

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdata import add_data_argument  # noqa: E402

ROOTS = ("kineto-public", "kineto-corpus")
HELD_OUT = ("kineto-corpus/tracelens/h100", "kineto-corpus/tracelens/mi300", "kineto-corpus/tracelens/b200", "kineto-corpus/param/dlrm_kineto")


@dataclass
class Row:
    name: str
    group: str
    ranks: int = 0
    steps: int = 0
    complete: bool = False  # iterations from step markers, not the whole window
    training: bool = False
    measured_ms: float | None = None
    replayed_ms: float | None = None
    error_pct: float | None = None
    template_pct: float | None = None  # every op at its mean over the steps: a prediction no step's own times feed
    refused: str = ""
    internal: str = ""
    departs: str = ""
    seconds: float = 0.0
    checks: list = field(default_factory=list)

    @property
    def counted(self) -> bool:
        return self.error_pct is not None and self.complete and self.training


def items(data: str) -> list[tuple[str, str]]:
    """(path, name) of every trace file or rank folder, in a stable order."""
    out = []
    for root in ROOTS:
        for folder, dirs, _ in sorted(os.walk(os.path.join(data, root))):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files = trace_files(folder)
            if not files:
                continue
            if len(files) > 1 and _distinct_ranks(files):
                out.append((folder, os.path.relpath(folder, data)))
            else:
                out += [(f, os.path.relpath(f, data)) for f in files]
    return out


def _distinct_ranks(files: list[str]) -> bool:
    """True when the files are different ranks of one job (else: several runs of one worker)."""
    ranks = []
    for f in files:
        try:
            ranks.append(read_cached(f).rank)
        except DagprofError:
            return False
        except Exception:  # an internal error shows on the row of the file itself
            return False
    return len(set(ranks)) == len(ranks)


def run_one(path: str, name: str, threshold_us: float) -> Row:
    row = Row(name, "held-out" if name.startswith(HELD_OUT) else "dev")
    t = time.perf_counter()
    try:
        prof = open_run(path)
        a, g = prof.analysis, prof.graph
        row.ranks, row.steps = len(prof.run.ranks), a.steps
        row.complete = all((r.events.kind == Kind.STEP).any() for r in prof.run.ranks)
        row.training = bool((g.kind == Kind.BACKWARD).any())
        row.measured_ms = None if a.measured_us is None else a.measured_us / 1e3
        row.replayed_ms = a.predicted_us / 1e3
        row.error_pct = a.error_pct
        if a.steps > 1 and a.measured_us:
            row.template_pct = 100.0 * (analyze(average_steps(g, replay)).predicted_us - a.measured_us) / a.measured_us
        ex = explain(g, a.result, threshold_us=threshold_us, per_lane=1)
        first = ex.false_edges[:1] or ex.departures[:1]
        row.departs = departure_line(first[0].to_dict()) if first else ""
        row.checks = violations(g)
    except DagprofError as err:
        row.refused = str(err)
    except Exception as err:  # noqa: BLE001 - a bug of ours: the row says so, the run goes on
        row.internal = f"{type(err).__name__}: {err}"
    row.seconds = time.perf_counter() - t
    return row


def summary(rows: list[Row], group: str | None) -> dict:
    mine = [r for r in rows if group is None or r.group == group]
    errs = [abs(r.error_pct) for r in mine if r.counted]
    tmpl = [abs(r.template_pct) for r in mine if r.counted and r.template_pct is not None]
    three = [r for r in mine if r.counted and r.template_pct is not None and r.steps >= 3]
    return {
        "group": group or "all", "rows": len(mine), "replayed": sum(r.error_pct is not None for r in mine),
        "training_complete_steps": len(errs), "median_abs_error_pct": statistics.median(errs) if errs else None,
        "max_abs_error_pct": max(errs) if errs else None, "within_3pct": sum(e <= 3.0 for e in errs),
        "template_rows": len(tmpl), "template_median_abs_error_pct": statistics.median(tmpl) if tmpl else None,
        "template_max_abs_error_pct": max(tmpl) if tmpl else None,
        "template_3_steps_within_3pct": [sum(abs(r.template_pct) <= 3.0 for r in three), len(three)],  # issue 20's goal
        "refused": sum(bool(r.refused) for r in mine), "internal_errors": sum(bool(r.internal) for r in mine),
    }


def rule_totals(rows: list[Row]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        for c in r.checks:
            t = out.setdefault(c.rule, {"edges": 0, "violated": 0, "worst_us": 0.0})
            t["edges"] += c.edges
            t["violated"] += c.violated
            t["worst_us"] = max(t["worst_us"], c.worst_us)
    return dict(sorted(out.items()))


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.2f} %"


def _ms(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_argument(p)
    p.add_argument("--threshold-us", type=float, default=100.0, help="drift that counts as a departure (--explain)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    data = os.path.abspath(args.data)
    if not any(os.path.isdir(os.path.join(data, r)) for r in ROOTS):
        sys.exit(f"bench_corpus: {data} holds neither {' nor '.join(ROOTS)} (--data DIR)")
    rows = []
    if not args.json:
        print(f"{'trace':<92} {'group':<8} {'ranks':>5} {'steps':>5} {'measured ms':>11} {'replayed ms':>11} {'error':>9} {'averaged':>9}  result")
    for path, name in items(data):
        r = run_one(path, name, args.threshold_us)
        rows.append(r)
        if args.json:
            continue
        result = f"refused: {r.refused}" if r.refused else f"internal error: {r.internal}" if r.internal else (
            ("" if r.complete else "one window; ") + ("training" if r.training else "no backward"))
        print(f"{name:<92} {r.group:<8} {r.ranks or '':>5} {r.steps or '':>5} {_ms(r.measured_ms):>11} {_ms(r.replayed_ms):>11} "
              f"{_pct(r.error_pct):>9} {_pct(r.template_pct):>9}  {result}", flush=True)
        if r.departs:
            print(f"{'':<10}departs: {r.departs}")
    groups = [summary(rows, g) for g in ("dev", "held-out", None)]
    totals = rule_totals(rows)
    if args.json:
        print(json.dumps({"rows": [{k: v for k, v in vars(r).items() if k != "checks"} | {"checks": [c.to_dict() for c in r.checks]} for r in rows],
                          "summary": groups, "violations": totals}))
        return
    print("\ninferred edges the measured timelines contradict (v began > 5 us before u ended), per rule, whole corpus:")
    for rule, t in totals.items():
        print(f"  {rule:<18} {int(t['violated']):>6} of {int(t['edges']):>8}   worst {t['worst_us'] / 1e3:.3f} ms")
    for s in groups:
        med = "n/a" if s["median_abs_error_pct"] is None else f"{s['median_abs_error_pct']:.2f} %"
        mx = "n/a" if s["max_abs_error_pct"] is None else f"{s['max_abs_error_pct']:.2f} %"
        print(f"summary [{s['group']}]: {s['rows']} traces/folders, {s['replayed']} replay; training with complete steps: "
              f"{s['training_complete_steps']}, median |error| {med}, max {mx}, {s['within_3pct']} within 3 %; "
              f"refused {s['refused']}, internal errors {s['internal_errors']}")
        if s["template_rows"]:
            print(f"  averaged replay (each op at its mean over the steps; {s['template_rows']} multi-step training traces): "
                  f"median |error| {s['template_median_abs_error_pct']:.2f} %, max {s['template_max_abs_error_pct']:.2f} %; "
                  f"with >= 3 steps, {s['template_3_steps_within_3pct'][0]} of {s['template_3_steps_within_3pct'][1]} within 3 %")


if __name__ == "__main__":
    main()
