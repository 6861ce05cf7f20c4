"""The mark a profile leaves in a run folder while its job runs (``dagprof profile``, the MXNet launcher).

Written before the job starts and removed when it ends, so a folder still holding it and no run manifest was left by a
profile stopped before its ranks wrote their profiles (a signal to the MXNet launcher, whose manifest comes last; SIGKILL,
the out-of-memory killer, a machine that went down), or one still starting: every reader refuses it in one line rather
than as an empty, partial or foreign folder. Once the ranks wrote the manifest, their own records say which steps a stop
cut (``completeness``), and the mark is not read. Standard library only at import, as ``mxnet_mark``: the MXNet launcher
(``collect.hooks.mxnet_ps``) may run under MXNet's Python, which cannot hold dagprof's dependencies.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Iterator

from ..errors import DagprofError

INCOMPLETE = "profile-incomplete.json"
# a finished run's manifest, written once its ranks wrote theirs: ``run_schema.MANIFEST``, ``formats.MXNET_MANIFEST``
MANIFESTS = ("manifest.json", "mxnet-run.json")


@dataclass(frozen=True)
class ProfilingMark:
    """Who profiles what since when (read back only to say when)."""

    pid: int
    started_unix_s: float
    command: list[str]


def mark(folder: str, cmd: list[str]) -> str:
    """Leave the mark in ``folder`` (written whole: a temp file renamed over it)."""
    path = os.path.join(folder, INCOMPLETE)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".tmp-{INCOMPLETE}.")
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(ProfilingMark(os.getpid(), time.time(), list(cmd))), f)
    os.replace(tmp, path)
    return path


@contextlib.contextmanager
def marked(folder: str, cmd: list[str]) -> Iterator[str]:
    """The mark in ``folder`` while the block runs (its path yielded), removed when the block ends, or when a signal stops
    it (``KeyboardInterrupt``) after the ranks wrote the run's manifest; left where a signal stopped it before."""
    path = mark(folder, cmd)
    stopped = False
    try:
        yield path
    except KeyboardInterrupt:
        stopped = True
        raise
    finally:
        if not stopped or finished(folder):
            os.unlink(path)


def finished(folder: str) -> bool:
    """Whether ``folder`` holds a run's manifest."""
    return any(os.path.exists(os.path.join(folder, m)) for m in MANIFESTS)


def require_finished(folder: str) -> None:
    """Refuse a folder a profile left its mark in before any rank wrote the manifest, naming when it started (a damaged
    mark refuses alike)."""
    path = os.path.join(folder, INCOMPLETE)
    if not os.path.isfile(path) or finished(folder):
        return
    import msgspec  # dagprof's own Python reads, where its dependencies are

    try:
        with open(path, "rb") as f:
            started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(msgspec.json.decode(f.read(), type=ProfilingMark).started_unix_s))
    except (OSError, msgspec.DecodeError, ValueError, OverflowError):
        started = "at an unknown time"
    raise DagprofError(f"incomplete profile: the dagprof profile started {started} ended before any rank wrote its profile "
                       f"(killed, or still starting; {INCOMPLETE} says so): profile the job again", folder)
