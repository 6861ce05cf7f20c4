from __future__ import annotations

import os

from ..pipeline import default_out, open_run, write_outputs
from .common import add_run_arguments

HELP = "write report.html (and the replayed Perfetto timeline) for a run"


def add_arguments(p) -> None:
    add_run_arguments(p)
    p.add_argument("-o", "--out", help="output folder (default: the run folder)")


def run(args) -> dict:
    prof = open_run(args.run, steps=args.steps, step_marker=args.step_marker)
    return {"files": write_outputs(prof, args.out or default_out(args.run))}


def to_text(r: dict) -> str:
    return "\n".join(f"{k.replace('_', ' ')}: {os.path.relpath(v)}" for k, v in r["files"].items())
