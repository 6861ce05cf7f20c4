"""Tiny dependency-free SVG charts for the HTML report."""
from __future__ import annotations

from html import escape

import numpy as np

PALETTE = {
    "forward": "#4e79a7",
    "backward": "#f28e2b",
    "communication": "#e15759",
    "update": "#76b7b2",
    "data loading": "#59a14f",
    "data": "#59a14f",
    "optimizer": "#76b7b2",
    "framework overhead": "#bab0ac",
    "other compute": "#9c755f",
    "memcpy": "#edc948",
    "other": "#d3d3d3",
    "compute": "#4e79a7",
    "overlap": "#b07aa1",
    "exposed communication": "#e15759",
    "straggler wait": "#ff9da7",
}


def color(key: str) -> str:
    return PALETTE.get(key, "#8c8c8c")


def stacked_bars(rows: list[tuple[str, dict[str, float]]], unit: str = "ms", width: int = 720) -> str:
    """One horizontal stacked bar per row; segments keyed by category."""
    if not rows:
        return ""
    total = max(sum(parts.values()) for _, parts in rows) or 1.0
    h, label_w, bar_w = 26, 150, width - 150 - 80
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h * len(rows) + 30}" font-family="sans-serif" font-size="12">']
    keys: list[str] = []
    for i, (label, parts) in enumerate(rows):
        y = i * h + 4
        out.append(f'<text x="0" y="{y + 15}">{escape(label)}</text>')
        x = float(label_w)
        for k, v in parts.items():
            w = bar_w * v / total
            if k not in keys:
                keys.append(k)
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0):.1f}" height="{h - 8}" fill="{color(k)}">'
                       f'<title>{escape(k)}: {v:.2f} {unit}</title></rect>')
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + 15}">{sum(parts.values()):.1f} {unit}</text>')
    y = h * len(rows) + 20
    x = 0.0
    for k in keys:
        out.append(f'<rect x="{x}" y="{y - 10}" width="10" height="10" fill="{color(k)}"/><text x="{x + 14}" y="{y}">{escape(k)}</text>')
        x += 24 + 7 * len(k)
    out.append("</svg>")
    return "".join(out)


def gantt(rows: list[tuple[str, np.ndarray, np.ndarray, list[str], list[str]]], t0: float, t1: float, width: int = 960) -> str:
    """rows: (label, start_us, end_us, category per slice, tooltip per slice)."""
    h, label_w = 18, 170
    span = max(t1 - t0, 1e-9)
    scale = (width - label_w - 10) / span
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h * len(rows) + 24}" font-family="sans-serif" font-size="11">']
    for i, (label, s, e, cats, tips) in enumerate(rows):
        y = i * h
        out.append(f'<text x="0" y="{y + 13}">{escape(label)}</text>')
        for a, b, c, tip in zip(s, e, cats, tips):
            if b <= t0 or a >= t1:
                continue
            x = label_w + (max(a, t0) - t0) * scale
            w = max((min(b, t1) - max(a, t0)) * scale, 0.5)
            out.append(f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{h - 4}" fill="{color(c)}"><title>{escape(tip)}</title></rect>')
    y = h * len(rows) + 16
    out.append(f'<text x="{label_w}" y="{y}">0 ms</text><text x="{width - 60}" y="{y}">{span / 1e3:.1f} ms</text></svg>')
    return "".join(out)


def line_chart(series: dict[str, list[tuple[float, float]]], x_label: str, y_label: str, width: int = 560, height: int = 320,
               log_x: bool = True, title: str = "") -> str:
    """Lines of (x, y) points, e.g. speed-up against workers per policy; NaN points are skipped."""
    series = {k: [(x, y) for x, y in s if y == y] for k, s in series.items()}
    pts = [p for s in series.values() for p in s]
    if not pts:
        return ""
    fx = (lambda v: np.log2(v)) if log_x else (lambda v: v)
    xs = [fx(x) for x, _ in pts]
    x0, x1 = min(xs), max(xs) or 1
    y1 = max(y for _, y in pts) * 1.1 or 1
    left, bottom = 50, 40
    sx = lambda v: left + (fx(v) - x0) / max(x1 - x0, 1e-9) * (width - left - 20)  # noqa: E731
    sy = lambda v: height - bottom - v / y1 * (height - bottom - 20)  # noqa: E731
    colors = list(dict.fromkeys(PALETTE.values()))  # each colour once: two series drawn alike read as one (mg-wfbp and linear did)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
           f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" y2="{height - bottom}" stroke="#333"/>',
           f'<line x1="{left}" y1="10" x2="{left}" y2="{height - bottom}" stroke="#333"/>',
           f'<text x="{width / 2}" y="{height - 5}" text-anchor="middle">{escape(x_label)}</text>',
           f'<text x="12" y="{height / 2}" transform="rotate(-90 12 {height / 2})" text-anchor="middle">{escape(y_label)}</text>']
    if title:
        out.append(f'<text x="{width / 2}" y="12" text-anchor="middle" font-size="13">{escape(title)}</text>')
    for x in sorted({x for x, _ in pts}):
        out.append(f'<text x="{sx(x):.1f}" y="{height - bottom + 14}" text-anchor="middle">{x:g}</text>')
    for k in range(5):
        v = y1 * k / 4
        out.append(f'<text x="{left - 4}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    for i, (name, s) in enumerate(series.items()):
        c = colors[i % len(colors)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{path}"/>')
        out.append(f'<text x="{left + 10}" y="{20 + 14 * i}" fill="{c}">{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def speedup_chart(workers: list[int], policies: dict[str, list[dict]], title: str = "") -> str:
    """Speed-up against workers per policy (rows with a "speedup"), with linear speed-up for reference."""
    series = {p: [(n, row["speedup"]) for n, row in zip(workers, rows)] for p, rows in policies.items()}
    series["linear"] = [(n, float(n)) for n in workers]
    return line_chart(series, "workers", "speed-up", title=title)
