from __future__ import annotations

from ..pipeline import open_run, write_outputs
from .common import add_out_argument, add_run_arguments, outputs, shown, warning_lines

HELP = "write report.html (and the replayed Perfetto timeline) for a run"


def add_arguments(p) -> None:
    add_run_arguments(p)
    add_out_argument(p, "report.html and the Perfetto timelines")


def run(args) -> dict:
    with outputs(args.out, args.run) as out:
        prof = open_run(args.run, steps=args.steps, step_marker=args.step_marker, allow_missing_ranks=args.allow_missing_ranks)
        return {"files": out.final_path(write_outputs(prof, out.path)), "partial": prof.run.meta.partial,
                "warnings": prof.warnings, "warnings_per_rank": prof.rank_warnings}


def to_text(r: dict) -> str:
    return "\n".join(warning_lines(r) + [f"{k.replace('_', ' ')}: {shown(v)}" for k, v in r["files"].items()])
