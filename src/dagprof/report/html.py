"""The report a person opens: one self-contained HTML file (inline SVG, no scripts, no network)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from html import escape

import numpy as np

from ..analysis import Analysis
from ..analysis.critical_path import category, op_words
from ..analysis.findings import Finding
from ..analysis.parallelism import INSIDE_OPS
from ..fsutil import atomic_open
from ..graph.dag import DeviceKind, Graph
from ..search.scenario import AXES
from ..traces.events import Kind
from ..traces.parallelism import Dim
from ..traces.steps import step_range
from ..units import MB, count
from . import svg

CSS = """
body{font-family:system-ui,sans-serif;max-width:1000px;margin:24px auto;color:#222;padding:0 12px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ddd;padding:4px 8px;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.big{font-size:28px;font-weight:600}.kpi{display:inline-block;margin-right:36px}.kpi small{display:block;color:#666}
.finding{border-left:4px solid #e15759;padding:4px 10px;margin:8px 0;background:#fdf3f3}
.ok{border-left-color:#59a14f;background:#f3f9f2}.warn{border-left-color:#edc948;background:#fdf9ec}code{background:#f4f4f4;padding:1px 4px}
.legend{font-size:13px;color:#444}
"""


@dataclass
class ReportInputs:
    analysis: Analysis
    findings: list[Finding]
    title: str = "dagprof report"
    whatifs: list[dict] = field(default_factory=list)  # rows: label, predicted_iter_ms, speedup, ...
    whatif_refused: str | None = None  # why no what-if was predicted (the model misses the profiled run), shown in its place
    optimisation: dict | None = None
    sections: list[tuple[str, str]] = field(default_factory=list)  # extra (title, html) blocks
    links: dict[str, str] = field(default_factory=dict)  # label -> relative path
    warnings: list[str] = field(default_factory=list)
    source: str | None = None  # the profile's folder as the reader finds it (the demo's moves after the graph is built); None: the graph's


def render(inp: ReportInputs) -> str:
    a = inp.analysis
    per = a.steps  # breakdowns and the critical path are summed over the profiled steps
    ms = lambda us: us / per / 1e3  # noqa: E731
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(inp.title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{escape(inp.title)}</h1>"]
    meta = a.graph.meta
    window = f"step{'s' if len(meta.steps) > 1 else ''} {escape(step_range(meta.steps))}"
    parts.append(f"<p>{count(len(a.predicted_iter_us), 'rank')}, backend {escape(str(meta.backend or '?'))}, "
                 f"{window}, graph of {len(a.graph):,} ops and {a.graph.num_edges:,} dependencies, "
                 f"source <code>{escape(str(inp.source or meta.source or ''))}</code></p>")
    parts.append("<div>")
    if a.measured_us is not None:
        parts.append(_kpi("measured iteration", f"{a.measured_us / 1e3:.1f} ms"))
    parts.append(_kpi("replayed iteration", f"{a.predicted_us / 1e3:.1f} ms"))
    if a.error_pct is not None:
        parts.append(_kpi("replay error", f"{a.error_pct:+.2f} %"))
    parts.append("</div>")

    for w in inp.warnings:
        parts.append(f"<div class='finding warn'><b>warning</b>: {escape(w)}</div>")
    parts.append("<h2>What limits scaling</h2>")
    for f in inp.findings:
        said = f"{f.ms_per_iter:.1f} ms" in f.detail  # the detail gives the figure already: not twice in one line
        parts.append(f"<div class='finding'><b>{escape(f.title)}</b>{'' if said else f' ({f.ms_per_iter:.1f} ms/iter)'}: {escape(f.detail)}</div>")
    if not inp.findings:
        parts.append("<div class='finding ok'>Nothing stands out: communication is hidden and ranks are balanced.</div>")

    parts.append("<h2>Per-rank breakdown (per iteration)</h2>")
    parts.append(svg.stacked_bars([(f"rank {b.rank}", {"compute": ms(b.compute_us - b.overlap_us), "overlap": ms(b.overlap_us),
                                                       "exposed communication": ms(b.exposed_comm_us)}) for b in a.ranks]))
    parts.append("<p class='legend'>Each bar: compute, the part of it overlapped by communication, and communication not hidden behind "
                 "compute; the rest of the iteration is waiting for other ranks and idle gaps.</p>")
    nan = float("nan")
    parts.append(html_table(["rank", "measured ms", "replayed ms", "compute ms", "comm ms", "overlap ms", "exposed comm ms", "waits for others ms"],
                            [[b.rank, a.measured_iter_us.get(b.rank, nan) / 1e3, a.predicted_iter_us.get(b.rank, nan) / 1e3, ms(b.compute_us),
                              ms(b.comm_us), ms(b.overlap_us), ms(b.exposed_comm_us), ms(b.wait_us)] for b in a.ranks]))

    # one data-parallel group alone (a plain DDP job) says nothing the breakdown above does not: the section is for meshes
    plain_dp = len(a.comm_dims) == 1 and a.comm_dims[0].dim == Dim.DP and not a.comm_dims[0].inside_ops
    if a.comm_dims and not plain_dp:
        par = a.graph.meta.parallel
        parts.append("<h2>Communication by mesh dimension (per iteration)</h2>")
        if par is not None:
            parts.append(f"<p>{escape(par.describe())}. " + escape(" ".join(par.notes)) + "</p>")
        inside = any(d.inside_ops for d in a.comm_dims)
        parts.append(html_table(["dimension", "collectives", "MB", "replayed ms"]
                                + ["inside the ops", "inside the ops MB", "inside the ops ms"] * inside + ["groups"],
                                [[d.dim.text, d.collectives / per, d.nbytes / per / MB, ms(d.replayed_us)]
                                 + [d.inside_ops / per, d.inside_bytes / per / MB, ms(d.inside_us)] * inside + [", ".join(d.groups[:8])]
                                 for d in a.comm_dims]))
        if inside:
            parts.append(f"<p>Inside the ops: {escape(INSIDE_OPS)}.</p>")

    cp = a.path
    parts.append("<h2>Critical path (across ranks, per iteration)</h2>")
    parts.append(svg.stacked_bars([("critical path", {k: ms(v) for k, v in cp.by_category.items()})]))
    crossed = cp.ranks_crossed
    on = f"crosses ranks {', '.join(map(str, crossed))}" if len(crossed) > 1 else f"stays on rank {crossed[0]}" if crossed else "crosses no rank"
    parts.append(f"<p>The path {on}; its largest ops:</p>")
    parts.append(html_table(["op", "ms/iter on the path"], [[op_words(name, cp.layer_types), ms(us)] for name, us in cp.top_ops]))

    parts.append("<h2>Replayed timeline (one iteration)</h2>")
    parts.append(timeline_svg(a))

    if inp.whatif_refused and not inp.whatifs:
        parts.append("<h2>What if</h2>")
        parts.append(f"<div class='finding'>{escape(inp.whatif_refused)}</div>")
    if inp.whatifs:
        parts.append("<h2>What if</h2>")
        parts.append(whatif_table(inp.whatifs))
    if inp.optimisation:
        o = inp.optimisation
        parts.append("<h2>Optimisation</h2>")
        parts.append(html_table(list(o.get("table_columns", [])), o.get("table", [])) if o.get("table") else "")
        if o.get("summary"):
            parts.append(f"<div class='finding ok'>{escape(o['summary'])}</div>")
        if o.get("notes"):
            parts.append("<ul class='legend'>" + "".join(f"<li>{escape(n)}</li>" for n in o["notes"]) + "</ul>")
    for title, body in inp.sections:
        parts.append(f"<h2>{escape(title)}</h2>{body}")
    if inp.links:
        parts.append("<h2>Files</h2><ul>")
        for label, href in inp.links.items():
            parts.append(f"<li><a href='{escape(href)}'>{escape(label)}</a> <code>{escape(href)}</code></li>")
        parts.append("</ul><p>Timelines open in <a href='https://ui.perfetto.dev'>ui.perfetto.dev</a> (Open trace file).</p>")
    parts.append("</body></html>")
    return "".join(parts)


def write_report(path: str | os.PathLike[str], inp: ReportInputs) -> str:
    with atomic_open(path) as f:
        f.write(render(inp))
    return os.fspath(path)


def _kpi(label: str, value: str) -> str:
    return f"<div class='kpi'><small>{escape(label)}</small><span class='big'>{escape(value)}</span></div>"


def _fmt(v) -> str:
    if isinstance(v, float):
        return "n/a" if np.isnan(v) else f"{v:,.2f}"
    return escape(str(v)) if v is not None else ""


def html_table(head: list[str], rows: list[list]) -> str:
    h = "".join(f"<th>{escape(str(c))}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


# a what-if row's prediction as a person reads it: one point per row, the interval around it (the mean step, the
# interval's bounds and level stay in --json); each head and its line of the legend in words, not the row's JSON keys
WHATIF_SHOWN = {
    "interval": ("predicted step", "the median of the replayed steps, and in brackets the range a run's median step should fall "
                                   "in, with how often (90 %: nine runs in ten); single steps spread wider"),
    "speedup_vs_profiled": ("x profiled", "throughput (workers / step time, mean steps) over the profiled run's, both replayed; "
                                          "above 1: more samples per second than now"),
    "scaling_efficiency": ("scaling efficiency", "one worker's step time over this one's, same conditions; 1.0 = linear, lower: "
                                                 "the cost of scale"),
}


def whatif_table(rows: list[dict]) -> str:
    """The what-if rows: the scenario's settings (an empty cell is as profiled), then ``WHATIF_SHOWN``, with its legend."""
    axes = [k for k in rows[0] if k in {a.name for a in AXES}]
    shown = [k for k in WHATIF_SHOWN if k in rows[0]]
    table = html_table([k.replace("_", " ") for k in axes] + [WHATIF_SHOWN[k][0] for k in shown],
                       [[w.get(k) for k in axes + shown] for w in rows])
    legend = "".join(f"<li><b>{escape(WHATIF_SHOWN[k][0])}</b>: {escape(WHATIF_SHOWN[k][1])}</li>" for k in shown)
    return (f"{table}<p>Predicted from this one profile; an empty setting is as profiled (compute speed 2: a device twice as fast)."
            f"</p><ul class='legend'>{legend}</ul>")


def timeline_svg(a: Analysis) -> str:
    """The middle profiled step of the replay as a gantt, one row per device plus the critical path."""
    g, res = a.graph, a.result
    steps = g.meta.steps
    if not steps:
        return ""
    step = steps[len(steps) // 2]
    sel = (g.step == step) & (g.device >= 0) & (g.dur > 0)
    if not sel.any():
        return ""
    t0, t1 = float(res.start[sel].min()), float(res.end[sel].max())
    on_path = np.zeros(len(g), dtype=bool)
    on_path[a.path.nodes] = True
    rows = []
    for d in np.unique(g.device[sel]):
        idx = np.flatnonzero(sel & (g.device == d))
        cats = [category(g.kind[v]) for v in idx]
        tips = [f"{g.node_name(v)} {g.dur[v] / 1e3:.2f} ms{' (critical path)' if on_path[v] else ''}" for v in idx]
        rows.append((_lane_label(g, d), res.start[idx], res.end[idx], cats, tips))
    crit = np.flatnonzero(sel & on_path & (g.kind != Kind.STEP))
    rows.append(("critical path", res.start[crit], res.end[crit], [category(g.kind[v]) for v in crit], [g.node_name(v) for v in crit]))
    return f"<p>Step {step}, as replayed; hover for op names.</p>" + svg.gantt(rows, t0, t1)


def _lane_label(g: Graph, d: int) -> str:
    """A timeline row's name as the Perfetto traces name it: ``rank 0: thread 8896 (main)`` for ``rank0/thread 8896
    (main)``, and the shared collectives' channel (``group 0``, a process group's id) ``collectives``, with its group
    only where the job has several."""
    dev = g.devices[d]
    if dev.kind == DeviceKind.COMM and dev.rank < 0:
        several = sum(x.kind == DeviceKind.COMM and x.rank < 0 for x in g.devices) > 1
        return f"collectives ({dev.name})" if several else "collectives"
    head, sep, rest = dev.name.partition("/")
    return f"rank {head[4:]}: {rest}" if sep and head.startswith("rank") and head[4:].isdigit() else dev.name
