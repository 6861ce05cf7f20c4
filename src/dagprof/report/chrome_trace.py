"""Chrome / Perfetto trace JSON (opens in ui.perfetto.dev and chrome://tracing).

One writer for every timeline dagprof emits: measured merged traces and replays. Events are
encoded by ``msgspec`` in C, a chunk at a time, so a trace of millions of events costs one
small struct per event while its chunk is written, never a dict per event nor the whole
document in memory.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Callable, Iterable, Iterator

import msgspec
import numpy as np

from ..fsutil import atomic_open

# Above this many events, commands that write Perfetto traces as a by-product skip them unless asked
# (a trace this size is hundreds of MB, and ui.perfetto.dev struggles to open it anyway).
LARGE_TRACE_EVENTS = 1_000_000
_CHUNK = 8192  # events made and encoded at a time: 65,536 held ~70 MB of slices, args and encoded bytes at once


@dataclass(slots=True)
class Slice:
    process: str  # a Perfetto process row group, e.g. "rank 0"
    track: str  # a thread row inside it, e.g. "main", "comm"
    name: str
    start_us: float
    dur_us: float
    args: dict[str, Any] = field(default_factory=dict)
    cat: str = ""


class _Event(msgspec.Struct, omit_defaults=True):
    ph: str
    pid: int
    name: str
    tid: int | None = None
    ts: float | None = None
    dur: float | None = None
    cat: str = ""
    args: dict[str, Any] | None = None


def rows(index: np.ndarray, columns: Callable[[np.ndarray], tuple[np.ndarray, ...]]) -> Iterator[tuple]:
    """The rows of ``columns(index[a:b])`` as Python values, a chunk of ``index`` at a time: a million events as Python
    lists whole cost ~30 bytes a value per column (``tolist`` of every column at once held 0.5 GB at 1,000,000 events)."""
    for a in range(0, len(index), _CHUNK):
        yield from zip(*(c.tolist() for c in columns(index[a:a + _CHUNK])))


def _plain(value: Any) -> Any:
    """numpy scalars (in metadata or args) as the Python numbers they hold."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} into a Chrome trace")


def write_chrome_trace(path: str | os.PathLike[str], slices: Iterable[Slice], metadata: dict[str, Any] | None = None) -> str:
    """Write atomically; processes and tracks are numbered in first-seen order."""
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    enc = msgspec.json.Encoder(enc_hook=_plain)
    it = iter(slices)
    with atomic_open(path, "wb") as f:
        f.write(b'{"displayTimeUnit":"ms","metadata":' + enc.encode(metadata or {}) + b',"traceEvents":[')
        sep = b""
        while chunk := list(islice(it, _CHUNK)):
            events = []
            for s in chunk:
                pid = pids.setdefault(s.process, len(pids))
                tid = tids.setdefault((s.process, s.track), len(tids))
                events.append(_Event("X", pid, s.name, tid, round(s.start_us, 3), round(s.dur_us, 3), s.cat, s.args or None))
            f.write(sep)
            f.write(memoryview(enc.encode(events))[1:-1])  # inside the [ ], uncopied
            sep = b","
        meta = []
        for name, pid in pids.items():
            meta.append(_Event("M", pid, "process_name", args={"name": name}))
            meta.append(_Event("M", pid, "process_sort_index", args={"sort_index": pid}))
        for (proc, track), tid in tids.items():
            meta.append(_Event("M", pids[proc], "thread_name", tid, args={"name": track}))
        if meta:
            f.write(sep + enc.encode(meta)[1:-1])
        f.write(b"]}")
    return os.fspath(path)
