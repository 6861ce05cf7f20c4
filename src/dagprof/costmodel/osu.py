"""OSU micro-benchmark all-reduce latency tables (``osu_allreduce``) and their alpha-beta fits.

A table is ``# ...`` comment lines and rows ``SIZE LATENCY_US`` or ``WORKERS,SIZE LATENCY_US``
(some logs prefix the worker count). The worker count comes from that prefix, else
from the digits in the file name (``allreduce4.log``), else from the caller.
Fitting the ring model per worker count lets the S-SGD model price messages the
benchmark never sent (a fused 50 MB gradient from a 4 B..1 MiB sweep): the fit
is an extrapolation and says so in ``OsuTable.describe``.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DagprofError
from ..fsutil import read_input
from ..traces import formats
from .alphabeta import AlphaBeta, fit_alpha_beta

_ROW = re.compile(r"(?:(\d+)\s*,\s*)?(\d+)\s+([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)")


@dataclass(frozen=True)
class OsuTable:
    workers: int
    nbytes: np.ndarray  # int64, ascending
    latency_us: np.ndarray
    source: str = ""

    def fit(self, min_bytes: int = 0) -> AlphaBeta:
        """Ring alpha-beta fit over messages of at least ``min_bytes`` (protocol switches make small ones misleading)."""
        keep = self.nbytes >= min_bytes
        if keep.sum() < 2:
            raise DagprofError(f"fewer than two messages of at least {min_bytes} B to fit", self.source or None)
        return fit_alpha_beta(self.nbytes[keep], self.latency_us[keep], workers=self.workers)

    def describe(self) -> str:
        return f"OSU all-reduce table, {self.workers} workers, {int(self.nbytes[0])} B..{int(self.nbytes[-1])} B ({Path(self.source).name})"


def read_osu_allreduce(path: str | os.PathLike[str], workers: int | None = None) -> OsuTable:
    path = os.fspath(path)
    sizes: list[int] = []
    lat: list[float] = []
    prefixes: set[int] = set()
    formats.expect(path, (), "an OSU all-reduce latency table")
    try:
        lines = read_input(path).decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DagprofError(f"cannot read: {err}", path) from None
    for lineno, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        m = _ROW.fullmatch(text)
        if not m:
            raise DagprofError(f"line {lineno}: expected 'SIZE LATENCY_US' or 'WORKERS,SIZE LATENCY_US', got {text[:60]!r}", path)
        if m.group(1):
            prefixes.add(int(m.group(1)))
        size, us = int(m.group(2)), float(m.group(3))
        if sizes and size <= sizes[-1]:
            raise DagprofError(f"line {lineno}: message sizes must increase ({size} after {sizes[-1]})", path)
        sizes.append(size)
        lat.append(us)
    if len(sizes) < 2:
        raise DagprofError("an OSU all-reduce table needs at least two rows", path)
    if len(prefixes) > 1:
        raise DagprofError(f"rows name several worker counts {sorted(prefixes)}", path)
    if prefixes:
        found = prefixes.pop()
    else:
        digits = re.findall(r"\d+", Path(path).stem)
        found = int(digits[-1]) if digits else None
    n = workers if workers is not None else found
    if n is None:
        raise DagprofError("cannot tell the worker count: no 'N,SIZE' rows and no number in the file name", path)
    if n < 2:
        raise DagprofError(f"an all-reduce table needs at least 2 workers, got {n}", path)
    return OsuTable(n, np.asarray(sizes, dtype=np.int64), np.asarray(lat, dtype=np.float64), path)
