"""The terminal edge: text a trace or a file name put into our output is shown, never obeyed.

Op names, layer names, file names and error messages come from the input; printed raw, an escape
sequence in one could clear the screen, set the terminal's title, or a newline could forge a line of
output. Every text line the CLI prints passes through here (``--json`` does not: it is exact JSON, whose
encoder escapes control characters itself).
"""
from __future__ import annotations

import re
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
