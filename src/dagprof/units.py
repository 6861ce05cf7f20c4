"""Byte sizes, one convention everywhere: KB, MB and GB are binary (2^10, 2^20, 2^30 bytes).

That is what DDP's ``bucket_cap_mb`` and torch's memory figures mean, so ``--bucket-mb 25``,
``--memory-budget 512MB`` and every "MB" dagprof prints are the same unit. ``KiB``/``MiB``/``GiB``
are accepted as exact synonyms. Bandwidths are rates on a wire and stay decimal (``10Gbit`` =
10^10 bit/s, ``costmodel.alphabeta.parse_bandwidth``).

The bounded numbers flags take (``positive_int`` ...) live here too, below every layer, so a table
that declares its own flags (``search.scenario.AXES``) parses them as the CLI does.
"""
from __future__ import annotations

import argparse
from typing import Callable, TypeVar

from .errors import DagprofError

T = TypeVar("T")

KB, MB, GB = 1 << 10, 1 << 20, 1 << 30
_UNITS = {"": 1, "b": 1, "k": KB, "kb": KB, "kib": KB, "m": MB, "mb": MB, "mib": MB, "g": GB, "gb": GB, "gib": GB}


def parse_size(text: str, flag: str) -> float:
    """``"512MB"``, ``"2GiB"``, ``"1.5g"``, ``"4096"`` -> bytes (binary units, see the module docstring)."""
    t = text.strip().lower().replace(" ", "")
    num = t.rstrip("kmgib")
    try:
        value = float(num) * _UNITS[t[len(num):]]
    except (ValueError, KeyError):
        raise DagprofError(f"cannot read size {text!r}: use e.g. 512MB, 2GiB (MB = MiB = 2^20 bytes)", flag) from None
    if not 0 < value < float("inf"):  # NaN fails too
        raise DagprofError(f"size must be positive and finite, got {text!r}", flag)
    return value


MAX_WORKERS = 65_536  # rank symmetry answers this many in seconds; beyond it a typo is likelier than a cluster
MAX_CONTENDED_WORKERS = 4_096  # with --cores ranks sharing cores differ, so none fold: this many replay in seconds


class _BadNumber(ValueError, argparse.ArgumentTypeError):
    """A flag value out of bounds: argparse prints its message (not just "invalid value"), list flags catch it as a ValueError."""


def _at_least(convert: Callable[[str], T], text: str, low: float, strict: bool = False, high: float | None = None) -> T:
    """``convert(text)``, checked to be >= ``low`` (> with ``strict``) and, given ``high``, finite and <= ``high``;
    else a ValueError saying what was expected."""
    what = f"a {'whole ' if convert is int else ''}number {'>' if strict else '>='} {low:g}" + (f" and <= {high:g}" if high else "")
    try:
        v = convert(text)
    except (ValueError, OverflowError):
        raise _BadNumber(f"expected {what}, got {text!r}") from None
    if not (v > low if strict else v >= low) or (high is not None and not v <= high):  # NaN fails too
        raise _BadNumber(f"expected {what}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    return _at_least(int, text, 1)


def non_negative_int(text: str) -> int:
    return _at_least(int, text, 0)


def positive_number(text: str) -> float:
    return _at_least(float, text, 0, strict=True)


def non_negative_number(text: str) -> float:
    return _at_least(float, text, 0)


def seconds(text: str) -> float:
    """A time budget: positive, at most a week."""
    return _at_least(float, text, 0, strict=True, high=7 * 86400.0)


def finite_positive(text: str) -> float:
    return _at_least(float, text, 0, strict=True, high=1e12)


def finite_non_negative(text: str) -> float:
    return _at_least(float, text, 0, high=1e12)


def worker_count(text: str) -> int:
    return _at_least(int, text, 1, high=MAX_WORKERS)


def count(n: float, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun in the number it takes, as every printed count is spelt: ``count(1, "bucket")`` is "1 bucket",
    ``count(2, "bucket")`` "2 buckets" (``plural`` for a noun not made plural by an "s": ``count(3, "server", "servers")``
    needs none, ``count(2, "copy", "copies")`` does); a count of 1.5 is plural."""
    return f"{n if isinstance(n, int) else format(n, 'g')} {noun if n == 1 else plural or noun + 's'}"


def figure(v: float) -> str:
    """A measured figure as a person writes it, the one way the reports print one: thousands' commas from 100 (``1,840``,
    not ``1.84e+03``), then three digits (``12.5``, ``1.23``, ``0.12``)."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
