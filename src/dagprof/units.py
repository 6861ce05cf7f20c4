"""Byte sizes, one convention everywhere: KB, MB and GB are binary (2^10, 2^20, 2^30 bytes).

That is what DDP's ``bucket_cap_mb`` and torch's memory figures mean, so ``--bucket-mb 25``,
``--memory-budget 512MB`` and every "MB" dagprof prints are the same unit. ``KiB``/``MiB``/``GiB``
are accepted as exact synonyms. Bandwidths are rates on a wire and stay decimal (``10Gbit`` =
10^10 bit/s, ``costmodel.alphabeta.parse_bandwidth``).
"""
from __future__ import annotations

from .errors import DagprofError

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
