"""Every flag of every subcommand says what it does (``dagprof CMD --help`` is the reference a new user reads)."""
import argparse

import pytest

from dagprof.cli.main import COMMANDS, _parser


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser, _ = _parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_has_help(command):
    p = _subparsers()[command]
    bare = [a.option_strings or [a.dest] for a in p._actions if not a.help]
    assert not bare, f"dagprof {command}: flags without help: {bare}"


def test_whatif_help_says_axes_take_lists():
    assert "comma-separated list" in _subparsers()["whatif"].format_help()
