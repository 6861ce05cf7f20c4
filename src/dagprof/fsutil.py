"""Our own files: written atomically (readers never see a half-written file, even while ranks still write),
and read back as versioned, typed documents that refuse a foreign, damaged or newer file in one line."""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator, TypeVar

import msgspec

from .errors import DagprofError

T = TypeVar("T")


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


class _Header(msgspec.Struct):
    format: str | None = None
    version: int = 0


def read_versioned(path: str | os.PathLike[str], kind: type[T], fmt: str, versions: range, what: str,
                   too_old: str) -> T:
    """Decode the JSON document ``path`` (``"format": fmt``, ``"version"`` in ``versions``) into ``kind``.

    Every problem is a one-line ``DagprofError`` naming the file: missing, unreadable, not JSON,
    another format, a newer version (upgrade dagprof), an older one (``too_old`` says what to do),
    a field of the wrong type. Fields ``kind`` does not know are skipped (added with defaults, same version).
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DagprofError("file is missing", path) from None
    except OSError as err:
        raise DagprofError(f"cannot read the file ({err.strerror or err})", path) from None
    return decode_versioned(data, path, kind, fmt, versions, what, too_old)


def decode_versioned(data: bytes, path: str, kind: type[T], fmt: str, versions: range, what: str, too_old: str) -> T:
    """``read_versioned`` of bytes already read (one record of an append-only file); ``path`` names it in errors."""
    try:
        head = msgspec.json.decode(data, type=_Header)
    except msgspec.ValidationError as err:
        raise DagprofError(f"corrupt file ({err})", path) from None
    except msgspec.DecodeError:
        raise DagprofError("corrupt or truncated file (not complete JSON)", path) from None
    if head.format != fmt:
        raise DagprofError(f"not a {what} (format {head.format!r}, expected {fmt!r})", path)
    reads = str(versions[0]) if len(versions) == 1 else f"{versions[0]}..{versions[-1]}"
    if head.version > versions[-1]:
        raise DagprofError(f"written by a newer dagprof (format version {head.version}; this one reads {reads}): "
                           "upgrade dagprof to read it", path)
    if head.version < versions[0]:
        raise DagprofError(f"written by an older dagprof (format version {head.version}; this one reads {reads}): {too_old}", path)
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as err:
        raise DagprofError(f"corrupt {what} ({err})", path) from None
