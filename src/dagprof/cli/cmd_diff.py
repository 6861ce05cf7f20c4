"""``dagprof diff A B``: what changed between two profiles of the same training, and why (by replay)."""
from __future__ import annotations

from ..analysis.diff import diff_profiles
from ..pipeline import open_run
from ..report.diff_html import write_diff
from ..traces.steps import step_range
from .common import add_input_limit, non_negative_int, outputs, shown, steps_arg

HELP = "compare two profiles of the same training: iteration, categories, critical paths, and which ops explain the change"


def add_arguments(p) -> None:
    p.add_argument("a", help="the baseline: a dagprof run folder, or a folder (or file) of torch.profiler traces")
    p.add_argument("b", help="the profile to compare with it (same training, after a change)")
    p.add_argument("--steps", type=steps_arg, default=None, metavar="A:B", help="profiled steps to use, in both (default: all)")
    p.add_argument("--top", type=non_negative_int, default=10, help="ops listed among those that changed most (default 10)")
    p.add_argument("-o", "--out", help="folder for diff.html and diff.trace.json (default: B's folder)")
    p.add_argument("--no-report", action="store_true", help="do not write diff.html and diff.trace.json")
    add_input_limit(p)


def run(args) -> dict:
    with outputs(args.out, args.b, write=not args.no_report) as staged:
        a = open_run(args.a, steps=args.steps)
        b = open_run(args.b, steps=args.steps)
        d = diff_profiles(a, b, top=args.top)
        out = d.to_dict() | {"warnings": [f"A: {w}" for w in a.warnings] + [f"B: {w}" for w in b.warnings]}
        if staged:
            out["files"] = staged.final_path(write_diff(staged.path, d))
    return out


def to_text(r: dict) -> str:
    a, b = r["a"], r["b"]
    lines = [f"warning: {w}" for w in r["warnings"]]
    lines += [f"A: {a['source']} ({len(a['ranks'])} rank(s), steps {step_range(a['steps'])})",
              f"B: {b['source']} ({len(b['ranks'])} rank(s), steps {step_range(b['steps'])})"]
    m = r["match"]
    lines.append(f"matched {m['matched_ops']} ops: {m['matched_pct_a']:.1f} % of A's, {m['matched_pct_b']:.1f} % of B's "
                 "(by rank, step, name, layer and bucket)")
    lines += [f"note: {n}" for n in r["notes"]]
    lines += ["", f"{'iteration':<12}{'A ms':>10}{'B ms':>10}{'delta ms':>11}{'delta':>9}"]
    for what, key in (("measured", "measured_iter_ms"), ("replayed", "replayed_iter_ms")):
        x, y = a[key], b[key]
        if x is not None and y is not None:
            lines.append(f"{what:<12}{x:>10.2f}{y:>10.2f}{y - x:>+11.2f}{100 * (y - x) / x:>+8.1f}%")
    lines += ["", f"{'per iteration (rank ops averaged over ranks)':<46}{'A ms':>10}{'B ms':>10}{'delta ms':>11}"]
    lines += [f"  {c['category']:<44}{c['a_ms']:>10.2f}{c['b_ms']:>10.2f}{c['delta_ms']:>+11.2f}" for c in r["categories_ms"]]
    at = r["attribution"]
    lines += ["", "attribution by replay: A's graph given B's times, one part at a time (ms per iteration)",
              f"  {'part':<44}{'iteration':>10}{'op time':>10}  (op time: mean over ranks)"]
    for p in at["parts"]:
        lines.append(f"  {p['label']:<44}{p['delta_ms']:>+10.2f}{p['op_delta_ms']:>+10.2f}")
        if "breakdown" in p:
            lines.append(f"    one {p['breakdown_by']} at a time:")
            lines += [f"      {_short(q['label'], 38):<38}{q['delta_ms']:>+10.2f}{q['op_delta_ms']:>+10.2f}" for q in p["breakdown"]]
            lines.append(f"      {'(interaction)':<38}{p['breakdown_interaction_ms']:>+10.2f}")
        if p.get("by_rank"):
            lines.append("    " + ", ".join(f"{q['label']} {q['delta_ms']:+.2f}" for q in p["by_rank"]))
    lines.append(f"  {'interaction (parts together vs one at a time)':<44}{at['interaction_ms']:>+10.2f}")
    lines.append(f"  {'structure (ops without a counterpart)':<44}{at['structure_ms']:>+10.2f}")
    lines.append(f"  {'= replayed change':<44}{at['replayed_delta_ms']:>+10.2f}")
    if r["replay_residual_ms"] is not None:
        lines.append(f"  {'not reproduced by the replays':<44}{r['replay_residual_ms']:>+10.2f}")
        lines.append(f"  {'= measured change':<44}{r['measured_delta_ms']:>+10.2f}")
    verdict = "within" if r["adds_up"] else "NOT within"
    lines.append(f"  interaction and replay residual: {r['unexplained_pct']:.1f} % of the longer iteration ({verdict} 2 %)")
    if r["top_ops"]:
        lines += ["", f"{'ops that changed most':<46}{'A ms':>10}{'B ms':>10}{'delta ms':>11}"]
        for o in r["top_ops"]:
            where = f"rank {o['rank']}" if o["rank"] >= 0 else "shared"
            lines.append(f"  {_short(where + '  ' + o['op'], 44):<44}{o['a_ms']:>10.2f}{o['b_ms']:>10.2f}{o['delta_ms']:>+11.2f}")
    lines += ["", "critical path per iteration (replayed)"]
    ca, cb = a["critical_path_per_iter"], b["critical_path_per_iter"]
    lines.append(f"  {'':<44}{'A ms':>10}{'B ms':>10}")
    lines.append(f"  {'total':<44}{ca['total_ms']:>10.2f}{cb['total_ms']:>10.2f}")
    for k in dict.fromkeys([*ca["by_category_ms"], *cb["by_category_ms"]]):
        lines.append(f"  {k:<44}{ca['by_category_ms'].get(k, 0.0):>10.2f}{cb['by_category_ms'].get(k, 0.0):>10.2f}")
    lines.append(f"  {'ranks crossed':<44}{str(ca['ranks_crossed']):>10}{str(cb['ranks_crossed']):>10}")
    for side, cp in (("A", ca), ("B", cb)):
        lines.append(f"  largest on {side}'s: " + ", ".join(f"{n} {v:.2f}" for n, v in cp["top_ops_ms"][:4]))
    if r.get("files"):
        lines += [""] + [f"{k.replace('_', ' ')}: {shown(v)}" for k, v in r["files"].items()]
    return "\n".join(lines)


def _short(label: str, width: int) -> str:
    """Fits a column: autograd's long prefix dropped, the rest cut with an ellipsis."""
    label = label.replace("autograd::engine::evaluate_function: ", "")
    return label if len(label) <= width else label[: width - 1] + "\u2026"
