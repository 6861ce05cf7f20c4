"""Files in and out. Ours are written atomically (readers never see a half-written file, even while ranks still
write) and read back as versioned, typed documents that refuse a foreign, damaged or newer file in one line.

Every file a reader takes in is opened by ``open_input`` / ``read_input``, so one rule holds for all formats:
only regular files (a FIFO or a device would hang or never end), at most ``max_input_bytes()`` held in memory
(a gzip member is decompressed with that cap, so a gzip bomb stops at it), and a file that a run folder names
must lie inside that folder (``inside``).
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
import zlib
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, Iterator, TypeVar

import msgspec

from .errors import DagprofError

T = TypeVar("T")


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO]:
    """Open a temp file beside ``path``; rename it over ``path`` only if the block succeeds."""
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    if os.path.isdir(path):  # os.replace would fail after the work, as an internal error
        raise DagprofError("is a folder: give a file name for this output", path)
    _existing_folder(folder, "give the output a path in a folder")
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-" + os.path.basename(path) + ".")
    except OSError as err:
        raise DagprofError(f"cannot write the output here ({err.strerror or err})", path) from None
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


MAX_BYTES_ENV = "DAGPROF_MAX_TRACE_BYTES"
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB of one input in memory: 20x the largest public training trace we read
_GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"
_NOT_REGULAR = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}


def max_input_bytes() -> int:
    """The cap on one input's bytes in memory (decompressed): ``$DAGPROF_MAX_TRACE_BYTES``, else 1 GiB."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise DagprofError(f"{MAX_BYTES_ENV}={text!r}: expected a whole number of bytes > 0")
    return value


def _refuse_special(mode: int, path: str) -> None:
    if not stat.S_ISREG(mode):
        what = _NOT_REGULAR.get(stat.S_IFMT(mode), "not a regular file")
        raise DagprofError(f"{what}, not a regular file: refused (dagprof reads only regular files)", path)


def open_input(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading if it is a regular file; else one-line ``DagprofError``, before any read.

    Checked before opening (a device is never opened) and again on the open descriptor (O_NONBLOCK, so
    even a FIFO swapped in between does not block the open).
    """
    path = os.fspath(path)
    try:
        _refuse_special(os.stat(path).st_mode, path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise DagprofError("file is missing, cannot read it", path) from None
    except OSError as err:
        raise DagprofError(f"cannot read the file ({err.strerror or err})", path) from None
    try:
        _refuse_special(os.fstat(fd).st_mode, path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def missing(path: str, what: str = "file or folder") -> DagprofError:
    """The error for an input ``path`` that does not exist: a link whose target does not (or that loops) said as such."""
    if os.path.islink(path):
        return DagprofError("a symbolic link to nothing (its target is missing, or the link loops)", path)
    return DagprofError(f"no such {what}", path)


def read_input(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file ``path``, gunzipped when it is gzip, at most ``max_input_bytes()``.

    Larger inputs (on disk, or once decompressed) are refused in one line saying how large and how to raise
    the cap; the decompression stops at the cap, so a gzip bomb never fills memory.
    """
    return b"".join(read_input_pieces(path))


def read_input_pieces(path: str | os.PathLike[str], size: int | None = None) -> Iterator[bytes]:
    """``read_input(path)`` in pieces of at most ``size`` bytes as they are read or decompressed (one piece per gzip
    member, or the whole file, when ``size`` is None): a reader that decodes as it goes never holds, nor pages in,
    the whole decompressed file. The same checks, each raised when the piece it concerns is reached. A leading UTF-8
    byte-order mark (a Windows editor's save, Excel's CSV) is dropped, as JSON allows: the readers called such files corrupt."""
    first = True
    for piece in _pieces(os.fspath(path), size):
        if first and piece:
            first, piece = False, piece.removeprefix(_UTF8_BOM)
        if piece:
            yield piece


def _pieces(path: str, size: int | None) -> Iterator[bytes]:
    cap = max_input_bytes()
    with open_input(path) as f:
        disk = os.fstat(f.fileno()).st_size
        if disk > cap:
            raise _too_large(f"{disk:,} bytes", cap, path)
        data = _read(f, cap + 1 if size is None else min(size, cap + 1), path)
        if data[:2] == _GZIP_MAGIC:  # compressed: read whole (a fraction of what it holds), decompressed in pieces
            data += _read(f, cap + 1 - len(data), path)
        else:
            total = 0
            while data:  # a file still growing is cut at the cap, not read on and on
                total += len(data)
                if total > cap:
                    raise _too_large(f"more than {cap:,} bytes", cap, path)
                yield data
                data = _read(f, cap + 1 - total if size is None else min(size, cap + 1 - total), path)
            return
    if len(data) > cap:
        raise _too_large(f"more than {cap:,} bytes", cap, path)
    yield from _gunzip(data, cap, path, size)


def _read(f: BinaryIO, n: int, path: str) -> bytes:
    try:
        return f.read(n)
    except OSError as err:
        raise DagprofError(f"cannot read the file ({err.strerror or err})", path) from None


def _gunzip(data: bytes, cap: int, path: str, size: int | None) -> Iterator[bytes]:
    """Every gzip member of ``data``, decompressed in C in pieces of at most ``size`` bytes (a member whole when
    None), with at most ``cap`` bytes out in all (as ``gzip.decompress``)."""
    inflate, errors = _inflater()
    total = 0
    while data:
        d, packed = inflate(16 + zlib.MAX_WBITS), len(data)
        while True:
            room = cap + 1 - total
            try:
                out = d.decompress(data, room if size is None else min(size, room))
            except errors as err:
                raise DagprofError(f"corrupt or truncated gzip ({err})", path) from None
            data = d.unconsumed_tail
            total += len(out)
            if total > cap:
                raise _too_large(f"more than {cap:,} bytes once decompressed ({packed:,} compressed)", cap, path)
            if out:
                yield out
            if d.eof:
                break
            if not out and not data:
                raise DagprofError("corrupt or truncated gzip (Compressed file ended before the end-of-stream marker was reached)", path)
        data = d.unused_data.lstrip(b"\0")
        if data and data[:2] != _GZIP_MAGIC:
            raise DagprofError("corrupt gzip (garbage after the compressed data)", path)


def _inflater() -> tuple[Any, tuple[type[Exception], ...]]:
    """ISA-L's inflate (installed with dagprof where it has wheels: same API, 2.4x zlib's speed, which is a fifth of a gzipped
    trace's cold load), else zlib's; with the errors each raises on corrupt data."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.decompressobj, (zlib.error,)
    return isal_zlib.decompressobj, (zlib.error, isal_zlib.error)


def _too_large(size: str, cap: int, path: str) -> DagprofError:
    return DagprofError(f"too large to read: {size}, over the {cap:,}-byte limit "
                        f"(raise it with --max-trace-bytes or {MAX_BYTES_ENV} if this input is genuine)", path)


def inside(folder: str | os.PathLike[str], name: str, referrer: str | os.PathLike[str]) -> str:
    """The path of the file ``name`` that ``referrer`` (a file of the run folder ``folder``) names.

    Only a name that resolves (symbolic links too) inside ``folder`` is accepted; anything else,
    ``../../etc/passwd`` or ``/dev/zero``, is refused in one line naming the referring file.
    """
    folder = os.fspath(folder)
    if not isinstance(name, str) or not name or "\0" in name:
        raise DagprofError(f"names the file {name!r}, which is not a file name: refused", referrer)
    path = os.path.join(folder, name)
    root = os.path.realpath(folder)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise DagprofError(f"names the file {name!r}, which is outside its run folder: refused", referrer)
    return path
MIN_FREE_BYTES = 16 << 20  # an output folder on a file system with less free space is refused before the work starts
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@dataclass(frozen=True)
class Staged:
    """A command's output folder while it works: files go to ``path``; they appear in ``final`` together."""

    path: str
    final: str

    def final_path(self, obj: T) -> T:
        """``obj`` (a path, or a dict or list holding paths) with staged paths rewritten to where they end up."""
        if isinstance(obj, str):
            inside = obj == self.path or obj.startswith(self.path + os.sep)
            return self.final + obj[len(self.path):] if inside else obj  # type: ignore[return-value]
        if isinstance(obj, dict):
            return {k: self.final_path(v) for k, v in obj.items()}  # type: ignore[return-value]
        if isinstance(obj, list):
            return [self.final_path(v) for v in obj]  # type: ignore[return-value]
        return obj


@contextlib.contextmanager
def staged_folder(final: str | os.PathLike[str]) -> Iterator[Staged]:
    """Write a set of outputs as one unit: into a hidden folder beside (or, when it exists, inside) ``final``,
    moved into ``final`` only when the block succeeds. A failure leaves ``final`` as it was (no new file
    beside the previous run's, no empty folder); a block that writes nothing creates nothing.

    Checked on entry, before any work (``check_output_folder``); a full disk or quota later is a one-line
    ``DagprofError`` too.
    """
    final = os.path.abspath(os.fspath(final))
    tmp, top = _staging(final)
    try:
        inner = os.path.join(tmp, os.path.relpath(final, top)) if top != final else tmp
        os.makedirs(inner, exist_ok=True)
        yield Staged(inner, final)
        _publish(tmp, top, final)
    except OSError as err:
        if err.errno in _FULL:
            raise DagprofError(f"no space left for the outputs ({err.strerror}); nothing was written", final) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_output_folder(final: str | os.PathLike[str]) -> None:
    """Refuse in one line, before any work, an output folder that is a file, that this user cannot write,
    or whose file system has less than ``MIN_FREE_BYTES`` free. Creates nothing."""
    tmp, _ = _staging(os.path.abspath(os.fspath(final)))
    os.rmdir(tmp)


def _existing_folder(path: str, hint: str) -> str:
    """``path``'s nearest existing ancestor (or itself), refused in one line where a file stands on the way (a later
    ``makedirs`` or rename would fail after the work, as an internal error). Checked twice: another rank may create the
    folder between the two looks (the demo's ranks write their step times into one new folder: read as a file, the
    second rank stopped its training)."""
    top = path
    while not os.path.isdir(top):
        if os.path.lexists(top) and not os.path.isdir(top):
            raise DagprofError(f"is a file, not a folder: {hint}", top)
        top = os.path.dirname(top)
    return top


def _staging(final: str) -> tuple[str, str]:
    """A new hidden folder in ``final``, or in its nearest existing ancestor (the second value), after the checks."""
    top = _existing_folder(final, "give the outputs a folder")
    try:
        tmp = tempfile.mkdtemp(dir=top, prefix=".dagprof-out-")
    except OSError as err:
        raise DagprofError(f"cannot write the outputs here ({err.strerror or err})", top) from None
    fs = os.statvfs(tmp)
    if fs.f_bavail * fs.f_frsize < MIN_FREE_BYTES:
        os.rmdir(tmp)
        raise DagprofError(f"no space for the outputs ({fs.f_bavail * fs.f_frsize // 1024} KiB free on its file system, "
                           f"{MIN_FREE_BYTES >> 20} MiB needed)", top)
    return tmp, top


def _publish(tmp: str, top: str, final: str) -> None:
    """Move what was staged in ``tmp`` (a folder in ``top``) to ``final``: the new folder whole when ``final``
    did not exist, else each entry, replacing the previous run's entry of that name."""
    if not any(files for _, _, files in os.walk(tmp)):
        return
    if top != final:
        first = os.path.relpath(final, top).split(os.sep)[0]
        os.rename(os.path.join(tmp, first), os.path.join(top, first))
        return
    for name in sorted(os.listdir(tmp)):
        src, dst = os.path.join(tmp, name), os.path.join(final, name)
        if os.path.isdir(dst) and not os.path.islink(dst):
            shutil.rmtree(dst)
        elif os.path.isdir(src) and os.path.lexists(dst):
            os.unlink(dst)
        os.replace(src, dst)


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
    return decode_versioned(read_input(path), path, kind, fmt, versions, what, too_old)


def decode_versioned(data: bytes, path: str, kind: type[T], fmt: str, versions: range, what: str, too_old: str) -> T:
    """``read_versioned`` of bytes already read (one record of an append-only file); ``path`` names it in errors."""
    try:
        head = msgspec.json.decode(data, type=_Header)
    except msgspec.ValidationError as err:
        raise DagprofError(f"corrupt file ({err})", path) from None
    except msgspec.DecodeError as err:  # says where: a cut file ends early, a NaN or a stray byte sits inside
        raise DagprofError(f"corrupt or truncated file (not valid JSON: {err})", path) from None
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
    except msgspec.DecodeError as err:  # the header skips what it does not type (a stray byte in another field's string)
        raise DagprofError(f"corrupt {what} (not valid JSON: {err})", path) from None
