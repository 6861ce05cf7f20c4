"""Options shared by the commands: the run argument, step windows, list flags, output folders.

Flag values are checked by argparse ``type=`` functions, so a wrong value is a one-line usage
error (exit status 2) before any work starts.
"""
from __future__ import annotations

import argparse
import contextlib
import os
from typing import Callable, TypeVar

from ..costmodel.alphabeta import parse_bandwidth
from ..errors import DagprofError
from ..fsutil import DEFAULT_MAX_BYTES, MAX_BYTES_ENV, Staged, staged_folder
from ..traces.ray_parse import ENV_VAR as RAY_ENV_VAR
from ..traces.steps import parse_steps
from ..units import (  # the bounded numbers flags take (``search.whatif``'s axes parse with them too); commands import them from here
    MAX_CONTENDED_WORKERS as MAX_CONTENDED_WORKERS,
    MAX_WORKERS as MAX_WORKERS,
    finite_non_negative as finite_non_negative,
    finite_positive as finite_positive,
    non_negative_int as non_negative_int,
    non_negative_number as non_negative_number,
    positive_int as positive_int,
    positive_number as positive_number,
    seconds as seconds,
    worker_count as worker_count,
)

T = TypeVar("T")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a dagprof run folder, or a folder (or file) of torch.profiler traces")
    p.add_argument("--steps", type=steps_arg, default=None, metavar="A:B",
                   help="profiled steps to use: A:B = steps A..B-1, A = step A alone (default: all that every rank has, less the "
                        "iterations that hold a long time between two steps, an evaluation's compile: said in a warning)")
    p.add_argument("--step-marker", type=_marker_name, metavar="NAME", default=None,
                   help="annotation that opens each iteration when the trace has no ProfilerStep (default: the whole window is one)")
    add_input_limit(p)
    p.add_argument("--allow-missing-ranks", action="store_true",
                   help="analyse a run that lacks ranks of its job, or holds some cut short (killed mid-window): "
                        "with a warning, outputs marked partial (default: refused)")
    p.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS", action=_RayAddress,
                   help="parse the rank traces as Ray tasks on a cluster (files on a shared filesystem); ADDRESS as for ray.init "
                        f"(default: auto, the cluster `ray start` runs here; or ${RAY_ENV_VAR})")


def add_input_limit(p: argparse.ArgumentParser) -> None:
    """``--max-trace-bytes``: main() hands it to every reader (and parse worker) as ``$DAGPROF_MAX_TRACE_BYTES``."""
    p.add_argument("--max-trace-bytes", type=positive_int, default=None, metavar="N",
                   help=f"largest input file read, in bytes once decompressed; larger ones are refused "
                        f"(default: ${MAX_BYTES_ENV}, else {DEFAULT_MAX_BYTES >> 30} GiB)")


class _RayAddress(argparse.Action):
    """``--ray`` sets ``$DAGPROF_RAY_ADDRESS`` for this process: where rank traces are parsed (traces/ray_parse.py)."""

    def __call__(self, parser, namespace, values, option_string=None):
        os.environ[RAY_ENV_VAR] = values
        setattr(namespace, self.dest, values)


def add_out_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("-o", "--out", metavar="DIR",
                   help=f"folder for {what} (default: the run folder; for trace files ./dagprof-out/<name>)")


def add_profiled_bandwidth_argument(p: argparse.ArgumentParser) -> None:
    """``--profiled-bandwidth RATE``, one flag with one meaning for ``whatif`` and ``optimize`` (``search.scenario.Cluster
    .profiled_bandwidth``): the profile's fitted link read against the wire it ran on, and its collectives the wire's,
    not a host's cores' (no ``shared_cores`` bounds, ``search.shared_cores.on_shared_cores``)."""
    p.add_argument("--profiled-bandwidth", metavar="RATE", type=bandwidth,
                   help="the wire rate the run was profiled at, e.g. 1Gbit (a tc-shaped link between one host's namespaces too): the "
                   "fitted link's time per byte beyond it is work on the cores (busy cores, not the link), which a --bandwidth what-if "
                   "keeps and only the wire's part scales; its collectives are the wire's, so no interval takes the shared-cores bounds")


def steps_arg(text: str) -> range:
    try:
        return parse_steps(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def bandwidth(text: str) -> str:
    """A link rate with its unit (``costmodel.alphabeta.parse_bandwidth``), kept as written; a bad one is a usage error."""
    try:
        parse_bandwidth(text)
    except DagprofError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def comma_list(item: Callable[[str], T]) -> Callable[[str], list[T]]:
    """The one list flag: ``a,b,c`` -> ``[item(a), item(b), item(c)]``.

    Blanks around items and empty items are ignored, the order is kept (it is the order of the
    rows printed), repeats are dropped; an empty list or a bad item is a usage error naming it.
    """
    def parse(text: str) -> list[T]:
        out: list[T] = []
        for raw in text.split(","):
            if raw.strip():
                try:
                    v = item(raw.strip())
                except (ValueError, DagprofError) as err:
                    raise argparse.ArgumentTypeError(str(err)) from None
                if v not in out:
                    out.append(v)
        if not out:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return out

    parse.__name__ = f"list of {getattr(item, '__name__', 'values')}"
    return parse


def out_dir(out: str | None, source: str) -> str:
    """``-o DIR`` as given, else the default for the input ``source`` (``pipeline.default_out``)."""
    from ..pipeline import default_out

    return os.path.abspath(out) if out else default_out(source)


def outputs(out: str | None, source: str, write: bool = True) -> contextlib.AbstractContextManager[Staged | None]:
    """The command's output folder (``out_dir``), staged (``fsutil.staged_folder``): checked before the work
    starts, its files written as one unit. ``write=False`` (the options ask for no file): None, nothing checked."""
    return staged_folder(out_dir(out, source)) if write else contextlib.nullcontext()


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} ms"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f} %"


def shown(path: str) -> str:
    """A written file as the user can open it: relative where it lies under the working folder, else absolute (a run in
    /tmp printed as ``../../../tmp/...`` from a checkout)."""
    rel = os.path.relpath(path)
    return os.path.abspath(path) if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def warning_lines(r: dict) -> list[str]:
    return [f"warning: {w}" for w in r.get("warnings", [])]


def _marker_name(text: str) -> str:
    """An annotation's name: an empty one names none (it was taken and ignored on a run with ProfilerSteps)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an annotation's name is needed, got an empty one")
    return text
