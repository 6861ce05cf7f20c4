"""The mark ``dagprof profile`` leaves in a run folder while its job runs.

Written before the job starts and removed when it ends, so a folder still holding it was left by a profile that was
stopped (a signal, a kill, a machine that went down) or is still running: whatever its ranks wrote by then is no
profile of the job, and every reader refuses it in one line rather than reading the files that happen to be there.
"""
from __future__ import annotations

import json
import os
import time

from ..errors import DagprofError

INCOMPLETE = "profile-incomplete.json"


def mark(folder: str, cmd: list[str]) -> str:
    """Leave the mark in ``folder``: who profiles what since when (read back only to say so)."""
    path = os.path.join(folder, INCOMPLETE)
    with open(path, "w") as f:
        json.dump({"pid": os.getpid(), "started_unix_s": time.time(), "command": cmd}, f)
    return path


def require_finished(folder: str) -> None:
    """Refuse a folder a profile left its mark in, naming when it started (a damaged mark refuses alike)."""
    path = os.path.join(folder, INCOMPLETE)
    if not os.path.isfile(path):
        return
    try:
        with open(path) as f:
            started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(json.load(f)["started_unix_s"])))
    except (OSError, ValueError, TypeError, KeyError, OverflowError):
        started = "at an unknown time"
    raise DagprofError(f"incomplete profile: the dagprof profile started {started} was stopped before its job ended (or is "
                       f"still running; {INCOMPLETE} says so): profile the job again", folder)
