"""The terminal edge: text a trace or a file name put into our output is shown, never obeyed.

Op names, layer names, file names and error messages come from the input; printed raw, an escape
sequence in one could clear the screen, set the terminal's title, or a newline could forge a line of
output. Every text line the CLI prints passes through here (``--json`` does not: it is exact JSON, whose
encoder escapes control characters itself).
"""
from __future__ import annotations

import re
import shutil
import textwrap
from typing import Any

# C0 and C1 controls (ESC, CSI, BEL, CR, newline, ...), DEL, line/paragraph separators, bidirectional overrides
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def escape(text: str) -> str:
    """``text`` with every control character written as a visible escape (``\\x1b``, ``\\n``, ``\\u202e``)."""
    return _CONTROL.sub(_escape, text)


def for_terminal(value: Any) -> Any:
    """A command's result with the control characters of every string in it (keys too) escaped, for ``to_text``."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {for_terminal(k): for_terminal(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [for_terminal(v) for v in value]
    return value


_NBSP = "\u00a0"
_UNIT = re.compile(r"(?<=\d) (?=(?:%|ms|us|s|x|[kMG]i?B|[kMG]bit/s)(?![\w/]))")  # "+0.4 %", "12 ms", "6.2 MB" stay one word


def wrap_lines(lines: list[str]) -> str:
    """Human output (never ``--json``) as one text whose long lines (a finding, a note: up to 330 characters) fold at the
    terminal's width (100 columns where the output is not a terminal), each continuation indented four columns under the
    line it continues. A figure is not split from its unit; a word longer than the width (a kernel's name) is not split."""
    width = max(40, shutil.get_terminal_size((100, 24)).columns)
    out = []
    for ln in lines:
        if len(ln) <= width:
            out.append(ln)
            continue
        indent = " " * (len(ln) - len(ln.lstrip(" ")) + 4)
        out += [w.replace(_NBSP, " ") for w in textwrap.wrap(_UNIT.sub(_NBSP, ln), width, subsequent_indent=indent,
                                                              break_on_hyphens=False, break_long_words=False)]
    return "\n".join(out)
