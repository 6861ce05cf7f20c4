"""A parsed ``RankTrace`` kept in the user's cache folder, so loading a folder the second time is a memory map away.

Stored as one uncompressed ``.npz`` (the event columns + a JSON header) in ``cache_dir()``:
``$DAGPROF_CACHE_DIR``, else ``$XDG_CACHE_HOME/dagprof``, else ``~/.cache/dagprof``; under
``$TMPDIR/dagprof-cache`` when that is not writable. Never beside the trace: nothing lands in a folder
the user did not ask us to write to. The file is named by a hash of the trace's absolute path; inside,
the key is the trace's size and mtime plus a hash of the reader's own source (``reader_version``), so
editing the reader or the trace invalidates it; a damaged cache file is a miss.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from functools import lru_cache

import numpy as np

from ..fsutil import atomic_open
from .events import Bucket, EventTable, Lane, LaneKind, RankTrace

ENV_VAR = "DAGPROF_CACHE_DIR"
_READER_FILES = ("kineto.py", "kineto_deps.py", "kineto_decode.py", "kineto_schema.py", "events.py", "cache.py")


@lru_cache(maxsize=1)
def reader_version() -> str:
    h = hashlib.sha1()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in _READER_FILES:
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def _key(trace_path: str) -> dict[str, object]:
    st = os.stat(trace_path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "reader": reader_version()}


def cache_dir() -> str:
    """Where parses are cached: ``$DAGPROF_CACHE_DIR``, else the XDG user cache folder (``~/.cache/dagprof``)."""
    if os.environ.get(ENV_VAR):
        return os.path.abspath(os.environ[ENV_VAR])
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")  # XDG: relative values are ignored
    return os.path.join(base, "dagprof")


def _candidates(trace_path: str) -> list[str]:
    """The user cache first, then the temp dir (when the cache folder cannot be written)."""
    p = os.path.abspath(trace_path)
    name = f"{hashlib.sha1(p.encode()).hexdigest()[:12]}-{os.path.basename(p)}.npz"
    return [os.path.join(cache_dir(), name), os.path.join(tempfile.gettempdir(), "dagprof-cache", name)]


def load_cached(trace_path: str) -> RankTrace | None:
    """The cached parse of ``trace_path`` if it is still valid, else None."""
    try:
        key = _key(trace_path)
    except OSError:
        return None
    for c in _candidates(trace_path):
        if not os.path.exists(c):
            continue
        try:
            with np.load(c, allow_pickle=False) as z:
                head = json.loads(z["header"].tobytes())
                if head.get("key") != key:
                    continue
                cols = {name: z[name] for name in EventTable.COLUMNS}
                flows = z["flows"]
                rules = z["flow_rule"]
            return _from_header(head, cols, flows, rules, trace_path)
        except (OSError, EOFError, ValueError, LookupError, TypeError, AttributeError, zipfile.BadZipFile):
            continue  # a cut or damaged cache file is a miss: the trace is parsed again and the file rewritten
    return None


def store(trace_path: str, trace: RankTrace) -> str | None:
    """Write the cache file; returns where, or None when no location is writable."""
    head = {
        "key": _key(trace_path), "rank": trace.rank, "world_size": trace.world_size, "base_ns": trace.base_ns,
        "host": trace.host, "backend": trace.backend, "layers": trace.layers, "groups": trace.groups,
        "group_ranks": trace.group_ranks, "meta": trace.meta, "names": trace.events.names,
        "lanes": [[lane.name, int(lane.kind), lane.main] for lane in trace.lanes],
        "buckets": [[b.index, b.nbytes, b.params] for b in trace.buckets],
    }
    arrays = {c: getattr(trace.events, c) for c in EventTable.COLUMNS}
    arrays["flows"] = np.asarray(trace.flows, dtype=np.int64).reshape(-1, 2)
    arrays["flow_rule"] = trace.rules()
    arrays["header"] = np.frombuffer(json.dumps(head).encode(), dtype=np.uint8)
    for c in _candidates(trace_path):
        with contextlib.suppress(OSError):
            with atomic_open(c, "wb") as f:
                np.savez(f, **arrays)
            return c
    return None


def _from_header(head: dict, cols: dict[str, np.ndarray], flows: np.ndarray, rules: np.ndarray, source: str) -> RankTrace:
    return RankTrace(
        rank=head["rank"], world_size=head["world_size"], source=source,
        events=EventTable(names=head["names"], **cols),
        lanes=[Lane(n, LaneKind(k), bool(m)) for n, k, m in head["lanes"]],
        base_ns=head["base_ns"], host=head["host"], backend=head["backend"], layers=head["layers"],
        groups=head["groups"], group_ranks={k: list(v) for k, v in head["group_ranks"].items()},
        flows=flows, flow_rule=rules, buckets=[Bucket(i, n, p) for i, n, p in head["buckets"]], meta=head["meta"],
    )
