"""One entry point for every input: a run folder, a folder of rank traces, or one trace file.

``formats.sniff`` says what the input is; its registry names the reader. A file dagprof
recognises but does not read is a one-line error naming the format; an unrecognised one goes
to the Kineto reader, whose own error says what is missing.
"""
from __future__ import annotations

import os

from ..errors import DagprofError
from ..fsutil import missing
from . import formats
from .completeness import lone_rank, require_complete
from .events import Run
from .horovod import OWN_CALLS
from .kineto_dir import read_cached, read_trace_dir
from .profiling_mark import require_finished
from .run_schema import MANIFEST


def load(path: str | os.PathLike[str], allow_missing_ranks: bool = False) -> Run:
    """Any input -> ``Run``. A run that lacks ranks of its job, or holds some cut short, is refused in
    one line naming them; ``allow_missing_ranks`` reads it as a partial run, warned (``completeness``)."""
    return require_complete(_read(os.fspath(path)), allow_missing_ranks)


def _read(p: str) -> Run:
    if not os.path.exists(p):
        raise missing(p)
    if os.path.isdir(p):
        require_finished(p)
    fmt = formats.sniff(p)
    if fmt is not None:
        return formats.read(p, fmt)
    if os.path.isdir(p):
        if os.path.exists(os.path.join(p, MANIFEST)):
            raise DagprofError("not a dagprof run folder (manifest.json names no format dagprof knows)", p)
        if os.path.exists(os.path.join(p, OWN_CALLS.format(rank=0))):
            raise DagprofError("nothing was profiled here: the Horovod script exchanged its gradients by its own hvd.* calls, not "
                               f"hvd.DistributedOptimizer ({OWN_CALLS.format(rank=0)} names them)", p)
        return read_trace_dir(p)  # ranks in parallel, parses cached beside the traces
    return kineto_file(p)


def kineto_file(path: str) -> Run:
    """One Kineto trace, through the parse cache; one rank of a larger job is that rank alone, warned (``lone_rank``)."""
    return lone_rank(Run([read_cached(path)], source=path))
