"""``dagprof`` command line: one module per command, one JSON object with ``--json``.

A command module ``cmd_<name>.py`` defines ``HELP``, ``add_arguments(parser)``,
``run(args) -> dict`` (JSON-serialisable) and ``to_text(result) -> str``.
User errors are ``DagprofError`` and print as one line, exit status 2.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import io
import json
import math
import os
import re
import sys

from ..errors import DagprofError
from ..fsutil import MAX_BYTES_ENV
from .terminal import escape, for_terminal

COMMANDS = [
    "profile",
    "demo",
    "replay",
    "analyze",
    "report",
    "optimize",
    "sgd",
    "whatif",
    "calibrate",
    "diff",
]


class _UsageError(Exception):
    """A wrong flag or flag value: one line, like every other user error."""


_NUMBER_LIKE = re.compile(r"^-\.?\d")  # -1Gbit, -5MB, -1e3, -2,4, -.5: a value, never one of our flags


class _Parser(argparse.ArgumentParser):
    """One line per usage error, and a value that starts with "-" and a digit reaches its flag's own check.

    argparse takes only plain negative numbers (-5) for values and answered ``--bandwidth -1Gbit`` (or ``-1e3``,
    ``-2,4``) "expected one argument": such a word after a flag that takes one value is passed as ``--flag=value``,
    which argparse reads as that flag's value whatever it starts with."""

    def __init__(self, *args, **kwargs) -> None:
        self._flags: dict[str, bool] = {}  # option string -> whether it takes one value; set before -h is added
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        self._flags.update(dict.fromkeys(action.option_strings, action.nargs is None))
        return action

    def parse_known_args(self, args=None, namespace=None):
        self._words = list(sys.argv[1:] if args is None else args)  # what ``error`` quotes (subcommands parse their own)
        return super().parse_known_args(self._joined(self._words), namespace)

    def _joined(self, words: list[str]) -> list[str]:
        out: list[str] = []
        for i, w in enumerate(words):
            if w == "--":  # the rest is positional
                return out + words[i:]
            if out and _NUMBER_LIKE.match(w) and self._takes_value(out[-1]):
                out[-1] = f"{out[-1]}={w}"
            else:
                out.append(w)
        return out

    def _takes_value(self, word: str) -> bool:
        """Whether ``word`` names a flag that takes one value: in full, or as argparse's unique prefix of a long one."""
        if word in self._flags:
            return self._flags[word]
        hits = [takes for f, takes in self._flags.items() if word.startswith("--") and f.startswith(word)]
        return len(hits) == 1 and hits[0]

    def error(self, message: str):  # argparse prints the whole usage first; we print one line
        raise _UsageError(f"{self.prog}: error: {message}{self._got(message)}")

    def _got(self, message: str) -> str:
        """For a flag whose value starts with "-" (argparse takes it for an option): the value, and how to pass it."""
        m = re.fullmatch(r"argument (\S+): expected one argument", message)
        words = getattr(self, "_words", [])
        if not m:
            return ""
        names = m.group(1).split("/")
        at = [i for i, w in enumerate(words[:-1]) if w in names or (w.startswith("--") and any(n.startswith(w) for n in names))]
        if not at:
            return ""
        flag, value = words[at[-1]], words[at[-1] + 1]
        if any(o.startswith(value.split("=")[0]) for o in self._flags):  # the flag's value is missing
            return ""
        return f", got {value!r} (a value that starts with '-' goes as {flag}={value})"


def _parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = _Parser(prog="dagprof", description="Why is distributed training slower than linear?")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name in COMMANDS:
        mod = importlib.import_module(f"dagprof.cli.cmd_{name}")
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        mod.add_arguments(p)
        modules[name] = mod
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    if isinstance(sys.stdout, io.TextIOWrapper):  # an op named in Unicode printed to an ASCII stdout: escaped, no traceback
        sys.stdout.reconfigure(errors="backslashreplace")
    parser, modules = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    tail = argv[argv.index("--") + 1:] if "--" in argv else None  # a training command: never parsed as our options
    ours = argv[: argv.index("--")] if tail is not None else argv
    try:
        args = parser.parse_args(ours)
        if tail is not None and not hasattr(args, "cmd"):
            parser.error(f"dagprof {args.command} takes no command after --")
    except _UsageError as err:
        if "--json" in ours:
            print(json.dumps({"error": str(err)}))
        print(escape(f"{err} (see --help)"), file=sys.stderr)
        return 2
    if tail is not None:
        args.cmd = tail
    if not args.command:
        parser.print_help()
        return 2
    mod = modules[args.command]
    if getattr(args, "max_trace_bytes", None):
        os.environ[MAX_BYTES_ENV] = str(args.max_trace_bytes)  # read by every opener, in parse workers too
    reserve = bytearray(_RESERVE_BYTES)  # given back on MemoryError, so that saying so does not run out too
    try:
        result = mod.run(args)
    except (DagprofError, RecursionError, MemoryError) as err:
        if isinstance(err, MemoryError):
            err.__traceback__ = reserve = None  # drop the failed work's frames and what they hold
            gc.collect()
        problem = _user_problem(err, args)
        if problem is None:  # a recursion of ours, not a too-deep input
            return _internal_error(args, err)
        if getattr(args, "json", False):
            print(json.dumps({"error": problem}))
        print(escape(f"dagprof {args.command}: error: {problem}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dagprof {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug of ours: still one line, the traceback on request
        return _internal_error(args, err)
    try:
        print(json.dumps(finite_json(result), default=_jsonable, allow_nan=False) if args.json else mod.to_text(for_terminal(result)))
        sys.stdout.flush()
    except BrokenPipeError:  # `dagprof ... | head`: the reader left, which is no error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    del reserve
    return 0


_RESERVE_BYTES = 8 << 20


def _internal_error(args, err: BaseException) -> int:
    if os.environ.get("DAGPROF_DEBUG"):
        raise err
    print(escape(f"dagprof {args.command}: internal error: {type(err).__name__}: {err} (set DAGPROF_DEBUG=1 for the traceback)"), file=sys.stderr)
    return 3


def _user_problem(err: BaseException, args) -> str | None:
    """The one line for a user error: a DagprofError, an input nested deeper than a decoder can follow, or one
    too large for this machine's memory; None for a RecursionError of ours."""
    if isinstance(err, DagprofError):
        return str(err)
    inputs = [os.fspath(getattr(args, k)) for k in ("run", "a", "b", "layers", "link_model", "topology")
              if isinstance(getattr(args, k, None), str) and os.path.exists(getattr(args, k))]
    where = ", ".join(inputs) or "the input"
    if isinstance(err, RecursionError):
        if not any(w in str(err) for w in ("decoding", "deserializing")):
            return None
        return f"{where}: JSON nested too deeply to read (arrays or objects more than about {sys.getrecursionlimit()} levels deep)"
    size = sum(_disk_bytes(p) for p in inputs)
    try:
        free = f", {os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.1f} GiB of memory free now"
    except (ValueError, OSError):
        free = ""
    helps = {"whatif": "fewer or smaller --workers, or no --fine", "sgd": "fewer or smaller --workers",
             "calibrate": "a smaller --max-mb"}.get(
        args.command, "a trace of fewer steps (profile a shorter window; --steps A:B trims what is replayed)")
    return f"{where}: out of memory ({size / 2**20:,.1f} MiB of input on disk{free}); try {helps}, or a machine with more memory"


def _disk_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files
               if os.path.isfile(os.path.join(d, f)))


def finite_json(obj, where: str = "$", bad: list[str] | None = None):
    """``obj`` with every NaN or infinity replaced by null, which JSON has (NaN and Infinity are not JSON); the
    top-level object gets ``non_finite``: where each was and what it was, so a null never passes silently."""
    top = bad is None
    bad = [] if top else bad
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        obj = obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
        bad.append(f"{where} was {obj}")
        return None
    if isinstance(obj, dict):
        obj = {k: finite_json(v, f"{where}.{k}", bad) for k, v in obj.items()}
    elif isinstance(obj, (list, tuple)):
        obj = [finite_json(v, f"{where}[{i}]", bad) for i, v in enumerate(obj)]
    if top and bad and isinstance(obj, dict):
        obj["non_finite"] = bad[:20] + ([f"... and {len(bad) - 20} more"] if len(bad) > 20 else [])
    return obj


def _jsonable(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


if __name__ == "__main__":
    sys.exit(main())
