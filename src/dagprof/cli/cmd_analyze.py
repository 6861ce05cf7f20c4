from __future__ import annotations

from ..analysis.parallelism import INSIDE_OPS
from ..pipeline import open_run
from ..units import count
from .common import add_run_arguments, ms, pct, warning_lines
from .terminal import wrap_lines

HELP = "explain a run: breakdown per rank, global critical path, stragglers, what limits scaling"


def add_arguments(p) -> None:
    add_run_arguments(p)


def run(args) -> dict:
    prof = open_run(args.run, steps=args.steps, step_marker=args.step_marker,
                    allow_missing_ranks=args.allow_missing_ranks)
    return prof.to_dict()


def to_text(r: dict) -> str:
    lines = warning_lines(r) + [f"iteration: measured {ms(r['measured_iter_ms'])}, replayed {ms(r['predicted_iter_ms'])} ({pct(r['error_pct'])})", "",
             f"{'rank':>5} {'compute':>10} {'comm':>10} {'overlap':>10} {'exposed':>10} {'waits':>10}   (ms per iteration)"]
    for b in r["per_rank"]:
        lines.append(f"{b['rank']:>5} " + " ".join(f"{b[k]:>10.2f}" for k in ("compute_ms", "comm_ms", "overlap_ms", "exposed_comm_ms", "straggler_wait_ms")))
    cp = r["critical_path_per_iter"]
    lines += ["", f"critical path ({cp['total_ms']:.2f} ms per iteration, crosses ranks {cp['ranks_crossed']}):"]
    lines += [f"  note: {cp['note']}"] if cp.get("note") else []
    for k, v in cp["by_category_ms"].items():
        lines.append(f"  {k:<22} {v:8.2f} ms")
        if k == "framework overhead":
            lines += _overhead_lines(cp.get("overhead_ms", {}))
    top = list(zip(cp["top_ops_words"], (v for _, v in cp["top_ops_ms"])))[:5]
    width = max([40] + [len(name) for name, _ in top])  # a named parameter-server key runs longer
    lines += ["  largest ops on it:"] + [f"    {name:<{width}} {v:8.2f} ms" for name, v in top]
    if r.get("communication_by_dim"):
        par = r.get("parallelism") or {}
        lines += ["", "communication by mesh dimension" + (f" ({par['summary']})" if par else "") + ", per iteration:"]
        lines += [f"  {d['dim']:<8} "
                  + (f"{d['collectives_per_iter']:>7.1f} collectives {_mb(d['mb_per_iter'])} {d['ms_per_iter']:>9.2f} ms"
                     if d["collectives_per_iter"] or not d["inside_ops_per_iter"] else "")
                  + (f"{' + ' * bool(d['collectives_per_iter'])}{d['inside_ops_per_iter']:.1f} inside the ops, "
                     + _inside_mb(d) + f"{d['inside_ops_ms_per_iter']:.2f} ms" if d["inside_ops_per_iter"] else "")
                  + f"   groups {', '.join(d['groups'][:6])}{' ...' if len(d['groups']) > 6 else ''}" for d in r["communication_by_dim"]]
        if any(d["inside_ops_per_iter"] for d in r["communication_by_dim"]):
            lines.append(f"    (inside the ops: {INSIDE_OPS})")
        lines += [f"    ({d['dim']}: {d['one_rank_group_per_iter']:.1f} of its collectives ran over a group of one rank, "
                  f"{d['one_rank_group_mb_per_iter']:.3f} MB that cross no link, not in its MB)"
                  for d in r["communication_by_dim"] if d.get("one_rank_group_per_iter")]
        for grp in (par.get("groups") or [])[:8]:
            label = ", ".join(f"{v} {k}" for k, v in grp["collectives"].items()) + (" collective" if sum(grp["collectives"].values()) == 1 else " collectives")
            lines.append(f"    group {grp['name']}{' (' + grp['desc'] + ')' if grp['desc'] else ''}: {label}; {'; '.join(grp['evidence'])}")
        lines += [f"  note: {n}" for n in par.get("notes", [])]
    if c := r.get("ps_compression"):
        lines.append(f"  note: pushes compressed ({c['type']}, kv.set_gradient_compression): a worker pushes {c['pushed_mb']:.3f} MB and "
                     f"pulls {c['pulled_mb']:.3f} MB per iteration; quantizing them (QuantizeCPU) took {c['quantize_ms']:.2f} ms per "
                     "iteration on each worker's engine")
    if r.get("clock_alignment"):
        c = r["clock_alignment"]
        offs = ", ".join(f"rank {k} {v:+.1f} us" for k, v in c["offset_us"].items())
        skew = c["residual_skew_us"]
        lines += ["", f"clocks aligned on {count(c['collectives_used'], 'collective')}: {offs}; residual skew median {skew['median']:.1f} us, "
                      f"max {skew['max']:.1f} us"]
    lines += ["", "findings:"] + [f"  - {f['title']}: {f['detail']}" for f in r["findings"]]
    return wrap_lines(lines)


def _overhead_lines(parts: dict[str, float], top: int = 8) -> list[str]:
    """The overhead's largest parts (``analysis.overhead``), the rest summed."""
    shown = [f"    {k:<60} {v:8.2f} ms" for k, v in list(parts.items())[:top] if v >= 0.005]
    rest = list(parts.values())[top:]
    rest_label = f"the rest ({count(len(rest), 'kind')})"
    return shown + ([f"    {rest_label:<60} {sum(rest):8.2f} ms"] if rest else [])


def _inside_mb(d: dict) -> str:
    """The bytes of a dimension's collectives inside the ops, where the collector recorded them (DTensor's functional
    collectives), and how many it recorded where not all; "" where none."""
    n, sized = d["inside_ops_per_iter"], d.get("inside_ops_sized_per_iter", 0.0)
    if not sized:
        return ""
    return f"{d['inside_ops_mb_per_iter']:.3f} MB" + (f" ({sized:.1f} sized)" if sized < n - 1e-9 else "") + ", "


def _mb(mb: float) -> str:
    """A dimension's bytes; 0 is a trace that timed its collectives without their sizes (Kineto without record_shapes)."""
    return f"{mb:>10.3f} MB" if mb > 0 else f"{'size not recorded':>13}"
