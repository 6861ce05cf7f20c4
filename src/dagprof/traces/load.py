"""One entry point for every input: a dagprof run folder, a folder of rank traces, or one trace file."""
from __future__ import annotations

import glob
import os

from ..errors import DagprofError
from .dagprof_run import MANIFEST, read_run
from .events import Run
from .kineto import read_kineto

_TRACE_PATTERNS = ("*.json", "*.json.gz")


def load(path: str | os.PathLike[str]) -> Run:
    p = os.fspath(path)
    if not os.path.exists(p):
        raise DagprofError("no such file or folder", p)
    if os.path.isdir(p):
        if os.path.exists(os.path.join(p, MANIFEST)):
            return read_run(p)
        files = sorted(f for pat in _TRACE_PATTERNS for f in glob.glob(os.path.join(p, pat)))
        if not files:
            raise DagprofError("no torch.profiler traces (*.json, *.json.gz) and no dagprof manifest here", p)
        return Run([read_kineto(f) for f in files], source=p)
    return Run([read_kineto(p)], source=p)
