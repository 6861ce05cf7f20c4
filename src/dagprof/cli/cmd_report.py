from __future__ import annotations

import os

from ..pipeline import open_run, write_outputs
from .common import add_out_argument, add_run_arguments, outputs

HELP = "write report.html (and the replayed Perfetto timeline) for a run"


def add_arguments(p) -> None:
    add_run_arguments(p)
    add_out_argument(p, "report.html and the Perfetto timelines")


def run(args) -> dict:
    with outputs(args.out, args.run) as out:
        prof = open_run(args.run, steps=args.steps, step_marker=args.step_marker)
        return {"files": out.final_path(write_outputs(prof, out.path))}


def to_text(r: dict) -> str:
    return "\n".join(f"{k.replace('_', ' ')}: {os.path.relpath(v)}" for k, v in r["files"].items())
