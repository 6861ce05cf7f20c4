"""Each rank's own Horovod trace lines of the profiled window (``traces.horovod_log``), kept from its standard output.

Horovod logs at ``HOROVOD_LOG_LEVEL=trace`` to ``std::cout`` and reads the level once, at its first message, so the
level holds for the whole job: the launcher sets it (``horovod_auto``) and this tee takes the rank's file descriptor 1
through a pipe. A thread passes every line on to the real output, except Horovod's own below its default level
(trace, debug, info: about ten a response) where dagprof set the level rather than the user, and keeps the lines about
performing responses while ``keep`` is on (the profiled window, and a little after, for the last response's end).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from ...errors import DagprofError
from ...fsutil import atomic_open
from ...traces.horovod_log import HOROVOD_LINE, RESPONSE_MARK

LEVEL_ENV = "HOROVOD_LOG_LEVEL"
QUIET_ENV = "DAGPROF_HOROVOD_LOG_QUIET"  # set by the launcher where it set the level: the user never asked for the lines
_TAIL_S = 0.5  # lines kept after the window ends: the last response's end is logged after synchronize() returned
_BELOW_DEFAULT = (b"T", b"D", b"I")
_MARK = RESPONSE_MARK.encode()


def wanted(env: dict[str, str] | None = None) -> bool:
    """Whether Horovod logs at the trace level in this process."""
    return (os.environ if env is None else env).get(LEVEL_ENV, "").strip().lower() == "trace"


class LogTee:
    """File descriptor 1 through a pipe: lines passed on, Horovod's response lines kept in ``path`` while ``keep``."""

    def __init__(self, quiet: bool):
        self.path: str | None = None  # set when the window begins (the rank is known then)
        self.quiet = quiet
        self._kept: list[bytes] = []
        self._keep_until: float | None = None  # None: not keeping; inf: in the window
        self._lock = threading.Lock()
        self._out = os.dup(1)
        read, write = os.pipe()
        os.dup2(write, 1)
        os.close(write)
        self._read = read
        self._thread = threading.Thread(target=self._pump, name="dagprof horovod log", daemon=True)
        self._thread.start()

    def keep(self, on: bool) -> None:
        """Start keeping lines (the window begins), or keep them a little longer, then write them (it ended)."""
        with self._lock:
            self._keep_until = float("inf") if on else time.monotonic() + _TAIL_S

    def _pump(self) -> None:
        rest = b""
        while True:
            try:
                chunk = os.read(self._read, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                if rest:
                    _write_all(self._out, rest)
                return
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            passed = []
            with self._lock:
                now = time.monotonic()
                keeping = self._keep_until is not None and now <= self._keep_until
                for line in lines:
                    m = HOROVOD_LINE.search(line)
                    if m and keeping and _MARK in line:
                        self._kept.append(line)
                    if not (m and self.quiet and m.group(1) in _BELOW_DEFAULT):
                        passed.append(line)
                if self._keep_until is not None and now > self._keep_until:
                    self._save()
            if passed:
                try:
                    _write_all(self._out, b"\n".join(passed) + b"\n")
                except OSError:  # the real output is gone: keep draining the pipe, or the rank's next print blocks
                    pass

    def _save(self) -> None:
        """The kept lines into ``path`` (under the lock), atomically; keeping stops. A file that cannot be written is
        left out (the reader then times the responses by rank 0's timeline alone): the pump must go on draining."""
        self._keep_until = None
        if self.path is None:
            return
        try:
            with atomic_open(self.path, "wb") as f:
                f.write(b"\n".join(self._kept) + (b"\n" if self._kept else b""))
        except (OSError, DagprofError):
            pass

    def close(self) -> None:
        """File descriptor 1 back to the real output (the thread passes on what is still in the pipe, up to a second),
        and the kept lines written if the window's tail has not yet."""
        sys.stdout.flush()
        os.dup2(self._out, 1)
        self._thread.join(timeout=1.0)
        with self._lock:
            if self._keep_until is not None:
                self._save()


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
