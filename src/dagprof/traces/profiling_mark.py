"""The mark ``dagprof profile`` leaves in a run folder while its job runs.

Written before the job starts and removed when it ends, so a folder still holding it and no ``manifest.json`` was left
by a profile killed before any rank began its window (SIGKILL, the out-of-memory killer, a machine that went down),
or one still starting: every reader refuses it in one line rather than as an empty or foreign folder. Once the ranks
wrote the manifest, their own records say which steps a stop cut (``completeness``), and the mark is not read.
"""
from __future__ import annotations

import os
import time

import msgspec

from ..errors import DagprofError
from ..fsutil import atomic_open
from .run_schema import MANIFEST

INCOMPLETE = "profile-incomplete.json"


class ProfilingMark(msgspec.Struct):
    """Who profiles what since when (read back only to say when)."""

    pid: int
    started_unix_s: float
    command: list[str]


def mark(folder: str, cmd: list[str]) -> str:
    """Leave the mark in ``folder``."""
    path = os.path.join(folder, INCOMPLETE)
    with atomic_open(path, "wb") as f:
        f.write(msgspec.json.encode(ProfilingMark(os.getpid(), time.time(), list(cmd))))
    return path


def require_finished(folder: str) -> None:
    """Refuse a folder a profile left its mark in before any rank wrote the manifest, naming when it started (a damaged
    mark refuses alike)."""
    path = os.path.join(folder, INCOMPLETE)
    if not os.path.isfile(path) or os.path.exists(os.path.join(folder, MANIFEST)):
        return
    try:
        with open(path, "rb") as f:
            started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(msgspec.json.decode(f.read(), type=ProfilingMark).started_unix_s))
    except (OSError, msgspec.DecodeError, ValueError, OverflowError):
        started = "at an unknown time"
    raise DagprofError(f"incomplete profile: the dagprof profile started {started} ended before any rank wrote its profile "
                       f"(killed, or still starting; {INCOMPLETE} says so): profile the job again", folder)
