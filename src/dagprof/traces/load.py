"""One entry point for every input: a dagprof run folder, a folder of rank traces, or one trace file."""
from __future__ import annotations

import os

from ..errors import DagprofError
from .dagprof_run import read_run
from .events import Run
from .kineto_dir import read_cached, read_trace_dir
from .mxnet import is_mxnet_run, read_mxnet_run
from .run_schema import MANIFEST


def load(path: str | os.PathLike[str]) -> Run:
    p = os.fspath(path)
    if not os.path.exists(p):
        raise DagprofError("no such file or folder", p)
    if os.path.isdir(p):
        if os.path.exists(os.path.join(p, MANIFEST)):
            return read_run(p)
        if is_mxnet_run(p):
            return read_mxnet_run(p)
        return read_trace_dir(p)  # ranks in parallel, parses cached beside the traces
    return Run([read_cached(p)], source=p)
