"""nccl-tests all-reduce tables -> one ring alpha-beta link model per GPU count.

A table is the CSV ``size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)``
(out-of-place, then in-place) that nccl-tests prints, one file per GPU count named
``..._GPU<N>_...`` (vTrain's ``AR_GPU8_1M_1024M_LUT``). The fits calibrate the GPU presets:
what an intra-node all-reduce really achieves on that machine, per number of GPUs.
"""
from __future__ import annotations

import csv
import glob
import io
import os
import re
from dataclasses import dataclass

import numpy as np

from ..errors import DagprofError
from ..fsutil import missing, read_input
from .alphabeta import AlphaBeta, fit_alpha_beta

_GPUS = re.compile(r"GPU(\d+)", re.IGNORECASE)


@dataclass
class LutFit:
    gpus: int
    link: AlphaBeta
    nbytes: np.ndarray
    time_us: np.ndarray  # measured (in-place)


def read_lut(path: str | os.PathLike[str]) -> tuple[int, np.ndarray, np.ndarray]:
    """(gpus, nbytes, in-place time in us) of one nccl-tests table."""
    p = os.fspath(path)
    m = _GPUS.search(os.path.basename(p))
    if not m:
        raise DagprofError("cannot tell the GPU count from the file name (expected ..._GPU<N>_...)", p)
    sizes, times = [], []
    try:
        with io.StringIO(read_input(p).decode("utf-8", errors="replace"), newline="") as f:
            rows = csv.reader(f)
            header = next(rows, None)
            if not header or not header[0].startswith("size"):
                raise DagprofError("not an nccl-tests table (first column must be size(B))", p)
            for row in rows:
                if len(row) >= 6:
                    sizes.append(float(row[0]))
                    times.append(float(row[5]) / 1e3)
    except ValueError as err:
        raise DagprofError(f"bad number in table ({err})", p) from None
    if len(sizes) < 2:
        raise DagprofError("table has fewer than two rows", p)
    return int(m.group(1)), np.array(sizes), np.array(times)


def fit_lut(path: str | os.PathLike[str]) -> LutFit:
    gpus, m, t = read_lut(path)
    return LutFit(gpus, fit_alpha_beta(m, t, gpus), m, t)


def fit_lut_folder(folder: str | os.PathLike[str]) -> dict[int, LutFit]:
    """Every table in ``folder`` (or one file), keyed by GPU count."""
    p = os.fspath(folder)
    if not os.path.exists(p):  # a typo or a link that loops: said as such, not as a folder without tables
        raise missing(p)
    files = [p] if os.path.isfile(p) else sorted(f for f in glob.glob(os.path.join(p, "*")) if _GPUS.search(os.path.basename(f)))
    if not files:
        raise DagprofError("no nccl-tests tables (*GPU<N>*) here", p)
    fits = [fit_lut(f) for f in files]
    return {f.gpus: f for f in fits}
