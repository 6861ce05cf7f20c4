"""``dagprof`` command line: one module per command, one JSON object with ``--json``.

A command module ``cmd_<name>.py`` defines ``HELP``, ``add_arguments(parser)``,
``run(args) -> dict`` (JSON-serialisable) and ``to_text(result) -> str``.
User errors are ``DagprofError`` and print as one line, exit status 2.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints the whole usage first; we print one line
        raise _UsageError(f"{self.prog}: error: {message}")


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
    try:
        result = mod.run(args)
    except DagprofError as err:
        if getattr(args, "json", False):
            print(json.dumps({"error": str(err)}))
        print(escape(f"dagprof {args.command}: error: {err}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dagprof {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug of ours: still one line, the traceback on request
        if os.environ.get("DAGPROF_DEBUG"):
            raise
        print(escape(f"dagprof {args.command}: internal error: {type(err).__name__}: {err} (set DAGPROF_DEBUG=1 for the traceback)"), file=sys.stderr)
        return 3
    try:
        print(json.dumps(result, default=_jsonable) if args.json else mod.to_text(for_terminal(result)))
        sys.stdout.flush()
    except BrokenPipeError:  # `dagprof ... | head`: the reader left, which is no error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _jsonable(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


if __name__ == "__main__":
    sys.exit(main())
