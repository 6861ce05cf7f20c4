"""One exception type for every user-facing failure.

The CLI prints ``str(err)`` as a single line and exits 2; library callers catch
``DagprofError``. Messages name the file (or flag) and the problem, so nobody
has to read a traceback to know what to fix.
"""
from __future__ import annotations

import os


class DagprofError(Exception):
    """A problem with the user's input or environment, reported in one line."""

    def __init__(self, problem: str, path: str | os.PathLike[str] | None = None):
        self.problem = problem
        self.path = None if path is None else os.fspath(path)
        super().__init__(f"{self.path}: {problem}" if self.path else problem)
