"""Atomic file writes: readers never see a half-written file, even while ranks still write."""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO]:
    """Open a temp file beside ``path``; rename it over ``path`` only if the block succeeds."""
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-" + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the mode open() would
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
