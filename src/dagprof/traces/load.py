"""One entry point for every input: a dagprof run folder, a folder of rank traces, or one trace file."""
from __future__ import annotations

import os

from ..errors import DagprofError
from .dagprof_run import MANIFEST, read_run
from .events import Run
from .horovod import is_horovod_run, read_horovod_run, sniff_timeline
from .kineto_dir import read_cached, read_trace_dir


def load(path: str | os.PathLike[str]) -> Run:
    p = os.fspath(path)
    if not os.path.exists(p):
        raise DagprofError("no such file or folder", p)
    if os.path.isdir(p):
        if os.path.exists(os.path.join(p, MANIFEST)):
            return read_horovod_run(p) if is_horovod_run(p) else read_run(p)
        return read_trace_dir(p)  # ranks in parallel, parses cached beside the traces
    if sniff_timeline(p):
        raise DagprofError("a Horovod timeline alone holds rank 0's communication only, no compute and no other rank: "
                           "profile the job with dagprof.collect.horovod (see the README) and open the run folder", p)
    return Run([read_cached(p)], source=p)
