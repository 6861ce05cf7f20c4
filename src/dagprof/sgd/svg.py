"""A tiny dependency-free SVG line chart: speed-up against workers, one line per policy, plus linear."""
from __future__ import annotations

from html import escape

_COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#b07aa1", "#9c755f"]


def speedup_svg(workers: list[int], series: dict[str, list[float]], title: str = "", width: int = 560, height: int = 340) -> str:
    """An SVG document (a string) the HTML report can embed; the dashed grey line is linear speed-up."""
    left, right, top, bottom = 48, 130, 28 if title else 12, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    x_max = max(workers) if workers else 1
    y_max = max([float(x_max)] + [v for vals in series.values() for v in vals if v == v]) or 1.0
    x_min = min(workers) if workers else 0

    def px(n: float) -> float:
        return left + (n - x_min) / max(x_max - x_min, 1) * plot_w

    def py(s: float) -> float:
        return top + plot_h - s / y_max * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">']
    if title:
        out.append(f'<text x="{left}" y="16" font-size="13">{escape(title)}</text>')
    for n in workers:
        out.append(f'<text x="{px(n):.1f}" y="{top + plot_h + 14}" text-anchor="middle">{n}</text>')
    for k in range(5):
        y = y_max * k / 4
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.3g}</text>')
        out.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + plot_w}" y2="{py(y):.1f}" stroke="#eee"/>')
    out.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 4}" text-anchor="middle">workers</text>')
    out.append(f'<text x="12" y="{top + plot_h / 2}" transform="rotate(-90 12 {top + plot_h / 2})" text-anchor="middle">speed-up</text>')
    if workers:
        out.append(f'<polyline points="{px(x_min):.1f},{py(x_min):.1f} {px(x_max):.1f},{py(x_max):.1f}" fill="none" stroke="#999" stroke-dasharray="4 3"/>')
    legend = [("linear", "#999")]
    for i, (name, values) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        points = " ".join(f"{px(n):.1f},{py(v):.1f}" for n, v in zip(workers, values) if v == v)
        out.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
        for n, v in zip(workers, values):
            if v == v:
                out.append(f'<circle cx="{px(n):.1f}" cy="{py(v):.1f}" r="3" fill="{color}"><title>{escape(name)}: {n} workers, speed-up {v:.2f}</title></circle>')
        legend.append((name, color))
    for i, (name, color) in enumerate(legend):
        y = top + 8 + 16 * i
        out.append(f'<line x1="{left + plot_w + 12}" y1="{y}" x2="{left + plot_w + 30}" y2="{y}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{left + plot_w + 34}" y="{y + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)
