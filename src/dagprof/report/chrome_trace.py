"""Chrome / Perfetto trace JSON (opens in ui.perfetto.dev and chrome://tracing).

One writer for every timeline dagprof emits: measured merged traces and replays.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..fsutil import atomic_open


@dataclass
class Slice:
    process: str  # a Perfetto process row group, e.g. "rank 0"
    track: str  # a thread row inside it, e.g. "main", "comm"
    name: str
    start_us: float
    dur_us: float
    args: dict[str, Any] = field(default_factory=dict)
    cat: str = ""


def write_chrome_trace(path: str | os.PathLike[str], slices: Iterable[Slice], metadata: dict[str, Any] | None = None) -> str:
    """Write atomically; processes and tracks are numbered in first-seen order."""
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    events: list[dict[str, Any]] = []
    for s in slices:
        pid = pids.setdefault(s.process, len(pids))
        tid = tids.setdefault((s.process, s.track), len(tids))
        ev = {"ph": "X", "pid": pid, "tid": tid, "name": s.name, "ts": round(s.start_us, 3), "dur": round(s.dur_us, 3)}
        if s.cat:
            ev["cat"] = s.cat
        if s.args:
            ev["args"] = s.args
        events.append(ev)
    for name, pid in pids.items():
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}})
        events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
    for (proc, track), tid in tids.items():
        events.append({"ph": "M", "pid": pids[proc], "tid": tid, "name": "thread_name", "args": {"name": track}})
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata or {}}
    with atomic_open(path) as f:
        json.dump(doc, f)
    return os.fspath(path)
