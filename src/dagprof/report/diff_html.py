"""``dagprof diff`` as a page (diff.html) and a Perfetto trace holding both replayed timelines.

``diff_section(d)`` is the HTML body alone, for another report to embed (``ReportInputs.sections``).
"""
from __future__ import annotations

import dataclasses
import os
from html import escape

from ..analysis.diff import ProfileDiff
from ..fsutil import atomic_open
from ..traces.steps import step_range
from . import svg
from .chrome_trace import write_chrome_trace
from .html import CSS, html_table, timeline_svg
from .timeline import replay_slices

_UP, _DOWN = "#e15759", "#59a14f"  # slower, faster


def write_diff(out_dir: str, d: ProfileDiff) -> dict[str, str]:
    """diff.html and diff.trace.json (A's and B's replayed timelines, one process per run and rank) in ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    trace = write_diff_trace(os.path.join(out_dir, "diff.trace.json"), d)
    page = os.path.join(out_dir, "diff.html")
    body = diff_section(d) + ("<h2>Files</h2><p><a href='diff.trace.json'>both replayed timelines</a> <code>diff.trace.json</code>: "
                              "open in <a href='https://ui.perfetto.dev'>ui.perfetto.dev</a> (Open trace file); "
                              f"processes named {escape(d.a.label)}: rank N and {escape(d.b.label)}: rank N.</p>")
    title = f"dagprof diff: {d.a.label} vs {d.b.label}"
    with atomic_open(page) as f:
        f.write(f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title><style>{CSS}</style></head>"
                f"<body><h1>{escape(title)}</h1>{body}</body></html>")
    return {"diff_report": page, "diff_trace": trace}


def write_diff_trace(path: str, d: ProfileDiff) -> str:
    slices = (dataclasses.replace(s, process=f"{side.label}: {s.process}")
              for side in (d.a, d.b) for s in replay_slices(side.analysis.graph, side.analysis.result, side.analysis.path.nodes))
    return write_chrome_trace(path, slices, {"producer": "dagprof diff", "a": d.a.source, "b": d.b.source})


def diff_section(d: ProfileDiff) -> str:
    a, b, m, att = d.a, d.b, d.match, d.attribution
    out = [f"<p>{escape(a.label)}: <code>{escape(a.source)}</code> ({len(a.ranks)} rank(s), steps {step_range(a.steps)})<br>"
           f"{escape(b.label)}: <code>{escape(b.source)}</code> ({len(b.ranks)} rank(s), steps {step_range(b.steps)})</p>",
           f"<p>{m.matched_ops:,} ops matched by rank, step, name, layer and bucket: {100 * m.fraction_a:.1f} % of {escape(a.label)}'s, "
           f"{100 * m.fraction_b:.1f} % of {escape(b.label)}'s.</p>"]
    out += [f"<div class='finding warn'>{escape(n)}</div>" for n in d.notes]
    rows = []
    for what, x, y in (("measured", a.measured_us, b.measured_us), ("replayed", a.replayed_us, b.replayed_us)):
        if x is not None and y is not None:
            rows.append([what, x / 1e3, y / 1e3, (y - x) / 1e3, f"{100 * (y - x) / x:+.1f} %"])
    out.append(html_table(["iteration", f"{a.label} ms", f"{b.label} ms", "change ms", "change"], rows))

    out.append("<h2>Where the change comes from (attribution by replay)</h2>")
    out.append(f"<p>{escape(a.label)}'s graph replayed with {escape(b.label)}'s measured times for one group of matched ops at a "
               "time: the change of the replayed iteration is that group's part. Interaction is what the parts do together beyond "
               "their sum; structure is what ops without a counterpart (other buckets, ranks) do. Waits for stragglers are no "
               "part of their own: they follow from the parts (a rank made slower makes the others wait), and the one-rank-at-a-time "
               "rows show whose change it was.</p>")
    bars = [(p.label, p.delta_us / 1e3, 0) for p in att.parts]
    for p in att.parts:
        at = next(i for i, row in enumerate(bars) if row[0] == p.label and row[2] == 0)
        bars[at + 1:at + 1] = [(q.label, q.delta_us / 1e3, 1) for q in p.breakdown]
    bars += [("interaction", att.interaction_us / 1e3, 0), ("structure", att.structure_us / 1e3, 0),
             ("= replayed change", att.delta_us / 1e3, 0)]
    if d.replay_residual_us is not None:
        bars += [("not reproduced by the replays", d.replay_residual_us / 1e3, 0), ("= measured change", d.measured_delta_us / 1e3, 0)]
    out.append(delta_bars(bars))
    table = []
    for p in att.parts:
        table.append([p.label, p.delta_us / 1e3, p.op_delta_us / 1e3, p.ops])
        if p.breakdown:
            table.append([f"\u00a0\u00a0one {p.breakdown_by} at a time:", None, None, None])
            table += [[f"\u00a0\u00a0\u00a0\u00a0{q.label}", q.delta_us / 1e3, q.op_delta_us / 1e3, q.ops] for q in p.breakdown]
            table.append(["\u00a0\u00a0\u00a0\u00a0(interaction)", p.interaction_us / 1e3, None, None])
        if p.by_rank:
            table.append(["\u00a0\u00a0one rank at a time:", None, None, None])
            table += [[f"\u00a0\u00a0\u00a0\u00a0{q.label}", q.delta_us / 1e3, q.op_delta_us / 1e3, q.ops] for q in p.by_rank]
    out.append(html_table(["part", "iteration change ms", "op time change ms (mean over ranks)", "ops changed"], table))
    verdict = "ok" if d.adds_up else "warn"
    out.append(f"<div class='finding {verdict}'>Interaction and what the replays do not reproduce together: "
               f"{d.unexplained_pct:.1f} % of the longer iteration.</div>")

    out.append("<h2>Per category (per iteration, rank ops averaged over ranks)</h2>")
    out.append(svg.stacked_bars([(a.label, {k: v / 1e3 for k, v in a.op_time_us.items() if v > 0}),
                                 (b.label, {k: v / 1e3 for k, v in b.op_time_us.items() if v > 0})]))
    out.append(html_table(["category", f"{a.label} ms", f"{b.label} ms", "change ms"], [[c, x / 1e3, y / 1e3, (y - x) / 1e3] for c, x, y in d.category_rows()]))
    out.append(html_table(["rank", f"{a.label} waits for others ms", f"{b.label} waits for others ms"],
                          [[ra.rank, ra.wait_us / 1e3 / max(len(a.steps), 1), rb.wait_us / 1e3 / max(len(b.steps), 1)]
                           for ra in a.analysis.ranks for rb in b.analysis.ranks if ra.rank == rb.rank]))

    if d.top_ops:
        out.append("<h2>Ops that changed most (per iteration)</h2>")
        out.append(html_table(["rank", "op", "category", f"{a.label} ms", f"{b.label} ms", "change ms"],
                              [[o.rank if o.rank >= 0 else "shared", o.label, o.category, o.a_us / 1e3, o.b_us / 1e3, o.delta_us / 1e3] for o in d.top_ops]))
    if d.unmatched:
        out.append("<h2>Ops without a counterpart</h2>")
        out.append(html_table(["run", "op", "category", "count", "ms per iteration"],
                              [[u.side, u.label, u.category, u.count, u.us_per_iter / 1e3] for u in d.unmatched]))

    out.append("<h2>Critical paths side by side (per iteration, replayed)</h2>")
    na, nb = max(len(a.steps), 1), max(len(b.steps), 1)
    out.append(svg.stacked_bars([(a.label, {k: v / 1e3 for k, v in a.path_us.items()}),
                                 (b.label, {k: v / 1e3 for k, v in b.path_us.items()})]))
    ta, tb = a.path.top_ops, b.path.top_ops
    cell = lambda ops, i, n: [ops[i][0], ops[i][1] / n / 1e3] if i < len(ops) else ["", None]  # noqa: E731
    out.append(html_table([f"{a.label}: op on the path", "ms", f"{b.label}: op on the path", "ms"],
                          [cell(ta, i, na) + cell(tb, i, nb) for i in range(max(len(ta), len(tb)))]))
    out.append(f"<p>Ranks crossed: {escape(a.label)} {a.path.ranks_crossed}, {escape(b.label)} {b.path.ranks_crossed}.</p>")
    for side in (a, b):
        out.append(f"<h2>{escape(side.label)}: replayed timeline</h2>{timeline_svg(side.analysis)}")
    return "".join(out)


def delta_bars(rows: list[tuple[str, float, int]], unit: str = "ms", width: int = 720) -> str:
    """Signed horizontal bars around a zero line: (label, value, indent level) per row."""
    if not rows:
        return ""
    h, label_w = 20, 260
    half = (width - label_w - 70) / 2
    zero = label_w + half
    top = max(abs(v) for _, v, _ in rows) or 1.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h * len(rows) + 8}" font-family="sans-serif" font-size="12">',
           f'<line x1="{zero}" y1="0" x2="{zero}" y2="{h * len(rows)}" stroke="#999"/>']
    for i, (label, v, indent) in enumerate(rows):
        y = i * h
        w = half * abs(v) / top
        x = zero if v >= 0 else zero - w
        out.append(f'<text x="{8 + 14 * indent}" y="{y + 14}">{escape(label)}</text>')
        out.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{max(w, 0.5):.1f}" height="{h - 6}" fill="{_UP if v >= 0 else _DOWN}" '
                   f'opacity="{1.0 if indent == 0 else 0.6}"><title>{escape(label)}: {v:+.2f} {unit}</title></rect>')
        tx = x + w + 4 if v >= 0 else x - 4
        out.append(f'<text x="{tx:.1f}" y="{y + 14}" text-anchor="{"start" if v >= 0 else "end"}">{v:+.2f}</text>')
    out.append("</svg>")
    return "".join(out)
