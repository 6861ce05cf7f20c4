from __future__ import annotations

from ..analysis.explain import DEFAULT_THRESHOLD_US, explain, text_lines
from ..pipeline import open_run, traces_skipped, write_outputs
from .common import add_out_argument, add_run_arguments, finite_non_negative, ms, outputs, pct, shown, warning_lines

HELP = "replay a run's global graph and compare the predicted iteration time with the measured one"


def add_arguments(p) -> None:
    add_run_arguments(p)
    add_out_argument(p, "replay.trace.json, measured.trace.json and report.html")
    p.add_argument("--write-traces", action="store_true", help="write the Perfetto traces however large (by default skipped above "
                   "1,000,000 events, with a note)")
    p.add_argument("--engine", choices=["auto", "numba", "python"], default="auto",
                   help="replayer: numba (compiled) or python, same answers (default auto: numba where it is installed)")
    p.add_argument("--template", action="store_true", help="replay every step with each op's mean time over the steps (dPRO's averaged replay)")
    p.add_argument("--explain", action="store_true",
                   help="where the replay departs from the measured timeline, per lane, and the edge that held each op back")
    p.add_argument("--explain-threshold", type=finite_non_negative, default=DEFAULT_THRESHOLD_US / 1e3, metavar="MS",
                   help=f"drift that counts as a departure (default {DEFAULT_THRESHOLD_US / 1e3:g} ms)")


def run(args) -> dict:
    with outputs(args.out, args.run) as staged:
        prof = open_run(args.run, steps=args.steps, engine=args.engine, template=args.template, step_marker=args.step_marker,
                        allow_missing_ranks=args.allow_missing_ranks)
        skipped = traces_skipped(prof, args.write_traces)
        files = staged.final_path(write_outputs(prof, staged.path, traces=skipped is None))
    a = prof.to_dict()
    keep = ("measured_iter_ms", "predicted_iter_ms", "error_pct", "per_rank", "steps", "nodes", "edges", "engine", "warnings", "warnings_per_rank", "partial")
    out = {k: a[k] for k in keep} | {"iteration_of": prof.graph.meta.job_name}
    if skipped:
        out["warnings"] = [*out["warnings"], skipped]
    if args.explain:
        out["explain"] = explain(prof.graph, prof.analysis.result, threshold_us=args.explain_threshold * 1e3).to_dict()
    return out | {"files": files}


def to_text(r: dict) -> str:
    lines = warning_lines(r) + [
        f"graph: {r['nodes']:,} ops, {r['edges']:,} dependencies, steps {r['steps'][0]}..{r['steps'][-1]}, engine {r['engine']}",
        f"{'rank':>6} {'measured':>12} {'predicted':>12} {'error':>9}"]
    for row in r["per_rank"]:
        measured = row["measured_iter_ms"]
        err = 100 * (row["predicted_iter_ms"] - measured) / measured if measured == measured else None
        lines.append(f"{row['rank']:>6} {ms(row['measured_iter_ms']):>12} {ms(row['predicted_iter_ms']):>12} {pct(err):>9}")
    lines.append(f"iteration ({r['iteration_of']}): measured {ms(r['measured_iter_ms'])}, predicted {ms(r['predicted_iter_ms'])}, error {pct(r['error_pct'])}")
    if "explain" in r:
        lines += ["", *text_lines(r["explain"])]
    lines += [f"{k.replace('_', ' ')}: {shown(v)}" for k, v in r["files"].items()]
    return "\n".join(lines)

