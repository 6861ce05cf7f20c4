"""Interconnect presets: nominal figures, derated to what collectives achieve in practice.

They are starting points; a run's own collectives (or ``dagprof calibrate``) give better fits.
"""
from __future__ import annotations

from ..errors import DagprofError
from .alphabeta import AlphaBeta

_GB = 1e9
PRESETS: dict[str, AlphaBeta] = {
    "pcie3": AlphaBeta.from_bandwidth(10 * _GB, latency_us=5.0),
    "pcie4": AlphaBeta.from_bandwidth(20 * _GB, latency_us=5.0),
    "nvlink": AlphaBeta.from_bandwidth(130 * _GB, latency_us=3.0),
    "10gbe": AlphaBeta.from_bandwidth(10e9 / 8 * 0.9, latency_us=25.0),
    "25gbe": AlphaBeta.from_bandwidth(25e9 / 8 * 0.9, latency_us=20.0),
    "100gbe": AlphaBeta.from_bandwidth(100e9 / 8 * 0.85, latency_us=15.0),
    "ib56": AlphaBeta.from_bandwidth(56e9 / 8 * 0.85, latency_us=5.0),
    "ib-edr": AlphaBeta.from_bandwidth(100e9 / 8 * 0.9, latency_us=3.0),
    "ib-hdr": AlphaBeta.from_bandwidth(200e9 / 8 * 0.9, latency_us=3.0),
}
_ALIASES = {"10gbe": ["10g", "10gbit"], "25gbe": ["25g"], "100gbe": ["100g"], "ib56": ["ib-fdr", "56gb-ib", "ib-56"], "ib-edr": ["ib100", "100gb-ib"]}


def preset(name: str) -> AlphaBeta:
    key = name.strip().lower()
    for canonical, aliases in _ALIASES.items():
        if key in aliases:
            key = canonical
    if key not in PRESETS:
        raise DagprofError(f"unknown interconnect {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[key]
