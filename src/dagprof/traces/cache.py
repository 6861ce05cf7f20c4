"""A parsed ``RankTrace`` kept in the user's own cache folder, so loading a folder the second time is a file read away.

Stored as one ``.parse`` file in ``cache_dir()``: a typed JSON header (key, metadata, where each array lies)
then the event columns' raw bytes, read with one ``readinto`` and viewed in place by numpy (no zip, no copy;
2-4x faster to load than an ``.npz``, whose zip CRC and chunked reads dominated). The folder is
``$DAGPROF_CACHE_DIR``, else ``$XDG_CACHE_HOME/dagprof``, else ``~/.cache/dagprof``; when that cannot be
used, ``$TMPDIR/dagprof-cache-<uid>``. Never beside the trace: nothing lands in a folder the user did
not ask us to write to.

A cache entry decides every number printed about its trace, so only a folder where nobody else can put
one is used: a folder owned by this user (effective uid) and not writable by group or others (created
0700). Any other folder (a shared temp folder, one planted by another user) is skipped: no cache, parses
are redone. The file is named by a hash of the trace's absolute path; inside, the key is the trace's
content (size, mtime, a hash of its first and last MiB) plus a hash of the reader's own source
(``reader_version``), so editing the reader or the trace invalidates it. An entry that is damaged, or
well-formed but inconsistent (an array missing, of another dtype or length, an index out of range), is a
miss: the trace is parsed again and the entry rewritten.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os
import stat
import tempfile
from functools import lru_cache
from typing import Any

import msgspec
import numpy as np

from ..errors import DagprofError
from ..fsutil import atomic_open, open_input
from .buckets import BucketLayout
from .events import Dep, EventTable, Kind, Lane, LaneKind, RankTrace
from .meta import RankMeta

ENV_VAR = "DAGPROF_CACHE_DIR"
_READER_FILES = ("kineto.py", "kineto_deps.py", "kineto_tables.py", "kineto_decode.py", "kineto_schema.py", "events.py", "buckets.py",
                 "meta.py", "comm_kind.py", "run_schema.py", "steps.py",
                 "cache.py")
_EDGE = 1 << 20  # the content key hashes this many bytes at each end of the trace


@lru_cache(maxsize=1)
def reader_version() -> str:
    h = hashlib.sha1()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in _READER_FILES:
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def _key(trace_path: str) -> dict[str, Any]:
    """What a valid entry must match: the trace's size, mtime and content at both ends, and the reader's version."""
    with open_input(trace_path) as f:
        st = os.fstat(f.fileno())
        h = hashlib.sha256(f.read(_EDGE))
        if st.st_size > _EDGE:
            f.seek(max(_EDGE, st.st_size - _EDGE))
            h.update(f.read(_EDGE))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "content": h.hexdigest(), "reader": reader_version()}


def cache_dir() -> str:
    """Where parses are cached: ``$DAGPROF_CACHE_DIR``, else the XDG user cache folder (``~/.cache/dagprof``)."""
    if os.environ.get(ENV_VAR):
        return os.path.abspath(os.environ[ENV_VAR])
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")  # XDG: relative values are ignored
    return os.path.join(base, "dagprof")


def _folders() -> list[str]:
    """The user cache first, then a per-user temp folder (used when the first cannot be created)."""
    return [cache_dir(), os.path.join(tempfile.gettempdir(), f"dagprof-cache-{os.geteuid()}")]


def _own(folder: str, create: bool) -> bool:
    """True when ``folder`` is a folder only this user can write (made 0700 first when ``create``)."""
    try:
        if create:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _entry(folder: str, trace_path: str) -> str:
    p = os.path.abspath(trace_path)
    return os.path.join(folder, f"{hashlib.sha1(p.encode()).hexdigest()[:12]}-{os.path.basename(p)}.parse")


_MAGIC = b"dagprof-parse\n"
_ALIGN = 64  # each array starts on a 64-byte boundary of the file (and of the buffer it is read into)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _Header(msgspec.Struct):
    """The JSON header of an entry, typed: a value of another type makes the entry a miss."""

    key: dict[str, Any]
    rank: int
    world_size: int
    base_ns: int
    host: str
    backend: str
    layers: list[str]
    groups: list[str]
    group_ranks: dict[str, list[int]]
    meta: RankMeta
    names: list[str]
    lanes: list[tuple[str, int, bool, bool]]
    buckets: BucketLayout
    arrays: list[tuple[str, str, list[int], int]]  # name, numpy dtype, shape, offset after the header


def load_cached(trace_path: str) -> RankTrace | None:
    """The cached parse of ``trace_path`` if it is still valid, else None."""
    try:
        key = _key(trace_path)
    except DagprofError:
        return None  # missing, unreadable or not a regular file: the reader says so
    for folder in _folders():
        c = _entry(folder, trace_path)
        if not os.path.exists(c) or not _own(folder, create=False):
            continue
        try:
            with open(c, "rb") as f:
                buf = bytearray(os.fstat(f.fileno()).st_size)
                if f.readinto(buf) != len(buf) or buf[:len(_MAGIC)] != _MAGIC:
                    continue
            n = int.from_bytes(buf[len(_MAGIC):len(_MAGIC) + 8], "little")
            head = msgspec.json.decode(memoryview(buf)[len(_MAGIC) + 8:len(_MAGIC) + 8 + n], type=_Header)
            if head.key != key:
                continue
            return _from_entry(head, buf, _aligned(len(_MAGIC) + 8 + n), trace_path)
        except (OSError, ValueError, LookupError, TypeError, msgspec.DecodeError):
            continue  # a cut, damaged or inconsistent entry is a miss: the trace is parsed again and the entry rewritten
    return None


def store(trace_path: str, trace: RankTrace) -> str | None:
    """Write the cache entry; returns where, or None when no folder of this user's own is writable."""
    try:
        key = _key(trace_path)
    except DagprofError:
        return None
    arrays = {c: getattr(trace.events, c) for c in EventTable.COLUMNS}
    arrays["flows"] = np.asarray(trace.flows, dtype=np.int64).reshape(-1, 2)
    arrays["flow_rule"] = np.asarray(trace.rules(), dtype=np.int8)
    arrays = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
    layout, offset = [], 0
    for name, a in arrays.items():
        layout.append([name, a.dtype.str, list(a.shape), offset])
        offset += _aligned(a.nbytes)
    head = {
        "key": key, "rank": trace.rank, "world_size": trace.world_size, "base_ns": trace.base_ns,
        "host": trace.host, "backend": trace.backend, "layers": trace.layers, "groups": trace.groups,
        "group_ranks": trace.group_ranks, "meta": trace.meta, "names": trace.events.names,
        "lanes": [[lane.name, int(lane.kind), bool(lane.main), bool(lane.pool)] for lane in trace.lanes],
        "buckets": msgspec.to_builtins(trace.buckets), "arrays": layout,
    }
    blob = msgspec.json.encode(head)
    lead = _MAGIC + len(blob).to_bytes(8, "little") + blob
    for folder in _folders():
        if not _own(folder, create=True):
            continue
        with contextlib.suppress(OSError):
            c = _entry(folder, trace_path)
            with atomic_open(c, "wb") as f:
                f.write(lead + bytes(_aligned(len(lead)) - len(lead)))
                for a in arrays.values():
                    f.write(a.tobytes() + bytes(_aligned(a.nbytes) - a.nbytes))
            return c
    return None


@lru_cache(maxsize=1)
def _dtypes() -> dict[str, np.dtype]:
    empty = EventTable.empty()
    return {c: getattr(empty, c).dtype for c in EventTable.COLUMNS}


def _arrays(head: _Header, buf: bytearray, start: int) -> dict[str, np.ndarray]:
    """Views of the entry's arrays in ``buf``, each of the dtype this reader writes and inside the file."""
    want = {**_dtypes(), "flows": np.dtype(np.int64), "flow_rule": np.dtype(np.int8)}
    out: dict[str, np.ndarray] = {}
    for name, dtype, shape, offset in head.arrays:
        if name not in want or name in out or dtype != want[name].str or offset < 0 or min(shape, default=0) < 0:
            raise ValueError(f"array {name!r}")
        count = math.prod(shape)
        if start + offset + count * want[name].itemsize > len(buf):
            raise ValueError(f"array {name!r} runs past the end of the entry")
        out[name] = np.frombuffer(buf, want[name], count, start + offset).reshape(shape)
    return out


def _from_entry(head: _Header, buf: bytearray, start: int, source: str) -> RankTrace:
    """The ``RankTrace`` of an entry, every array checked against the header (ValueError, KeyError: a miss)."""
    z = _arrays(head, buf, start)
    cols = {c: z[c] for c in EventTable.COLUMNS}
    flows, rules = z["flows"], z["flow_rule"]
    n = len(cols["start"])
    if any(a.shape != (n,) for a in cols.values()) or flows.ndim != 2 or flows.shape[1] != 2 or rules.shape != (len(flows),):
        raise ValueError("arrays of different lengths")
    bounds = [(cols["name"], 0, len(head.names)), (cols["lane"], 0, len(head.lanes)), (cols["kind"], 0, max(Kind) + 1),
              (cols["layer"], -1, len(head.layers)), (cols["group"], -1, len(head.groups)), (flows, 0, n),
              (rules, 0, max(Dep) + 1)]
    for values, low, stop in bounds:
        if values.size and (values.min() < low or values.max() >= stop):
            raise ValueError("index out of range")
    return RankTrace(
        rank=head.rank, world_size=head.world_size, source=source,
        events=EventTable(names=head.names, **cols),
        lanes=[Lane(name, LaneKind(kind), main, pool) for name, kind, main, pool in head.lanes],
        base_ns=head.base_ns, host=head.host, backend=head.backend, layers=head.layers,
        groups=head.groups, group_ranks=head.group_ranks,
        flows=flows, flow_rule=rules, buckets=head.buckets, meta=head.meta,
    )
