"""Options and loading shared by the commands that read a run."""
from __future__ import annotations

import argparse


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a dagprof run folder, or a folder (or file) of torch.profiler traces")
    p.add_argument("--steps", type=parse_steps, default=None, metavar="A:B", help="profiled steps to use (default: all that every rank has)")
    p.add_argument("--step-marker", metavar="NAME", default=None,
                   help="annotation that opens each iteration when the trace has no ProfilerStep (default: the whole window is one)")


def parse_steps(text: str) -> range:
    try:
        a, _, b = text.partition(":")
        lo = int(a)
        hi = int(b) if b else lo + 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps takes A:B (steps A..B-1), got {text!r}") from None
    if hi <= lo:
        raise argparse.ArgumentTypeError(f"--steps {text}: the end must be after the start")
    return range(lo, hi)


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} ms"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f} %"



def warning_lines(r: dict) -> list[str]:
    return [f"warning: {w}" for w in r.get("warnings", [])]
