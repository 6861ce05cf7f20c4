"""Horovod's timeline (``horovod_timeline.json``, rank 0's Chrome trace of its background thread) -> ``Timeline``: the
responses it executed, fused, with their copies and transfers, the loop's cycles and the negotiations.

The timeline is a log of Horovod's background thread on rank 0, in the order it happened:
``CYCLE_START`` markers (one per loop cycle), per tensor (one "pid" each) ``NEGOTIATE_*``
spans (first rank ready -> all ranks ready) with per-rank ready marks on the uncached path,
then the response: a top-level span per tensor (``ALLREDUCE``...) whose nested activities are
``INIT_FUSION_BUFFER``, ``MEMCPY_IN_FUSION_BUFFER``, the transfer (``GLOO_ALLREDUCE``...),
``MEMCPY_OUT_FUSION_BUFFER``. The tensors of one fused response start one after another in
the log before any of their activities, so consecutive starts form a response.

A timeline cut short by a killed writer keeps its complete events; responses still running at its end are dropped.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import DagprofError
from ..fsutil import read_input
from .kineto_schema import dtype_bytes

_TRANSFER = re.compile(r"^(GLOO|MPI|NCCL|CCL|DDL)_")


@dataclass
class Response:
    """One (fused) response as Horovod's background thread executed it; times in epoch us."""

    index: int
    op: str  # allreduce, broadcast, allgather, ...
    tensors: list[str]  # Horovod tensor names, in fusion-buffer order
    start: dict[str, float] = field(default_factory=dict)  # per tensor: response span start
    end: dict[str, float] = field(default_factory=dict)
    activities: dict[str, list[float]] = field(default_factory=dict)  # name -> [first start, last end]
    nbytes: dict[str, int] = field(default_factory=dict)  # per tensor, from the end event's dtype and shape
    dtype: str = ""
    cycle: float | None = None  # the CYCLE_START before it (None: cycles not marked)

    @property
    def t0(self) -> float:
        return min(self.start.values())

    @property
    def t1(self) -> float:
        return max(self.end.values(), default=self.t0)

    @property
    def transfer(self) -> tuple[float, float] | None:
        spans = [v for k, v in self.activities.items() if _TRANSFER.match(k)]
        return (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None

    @property
    def complete(self) -> bool:
        return len(self.end) == len(self.tensors) and self.transfer is not None


@dataclass
class Timeline:
    path: str
    epoch_us: float  # Unix time of the timeline's ts 0
    responses: list[Response]
    cycles: np.ndarray  # CYCLE_START times (epoch us), sorted
    negotiations: dict[str, list[tuple[float, float]]]  # tensor -> (first rank ready, all ready) spans
    ready_marks: dict[str, list[tuple[int, float]]]  # tensor -> (rank, time): uncached negotiations only
    problems: list[str] = field(default_factory=list)
    joins: list[float] = field(default_factory=list)  # when each ``hvd.join()`` returned (its lone end event), epoch us

    def shifted(self, us: float) -> "Timeline":
        """The same timeline ``us`` later: Horovod dates it from two clock reads at ``hvd.init`` (``TimelineWriter::
        Initialize``: Unix time, then the monotonic clock), so a thread preempted between them writes an epoch early by
        the preemption (6 ms seen on a loaded 2-core host); ``traces.horovod`` measures it against rank 0's steps."""
        move = lambda x: x + us  # noqa: E731
        responses = [dataclasses.replace(r, start={k: move(v) for k, v in r.start.items()}, end={k: move(v) for k, v in r.end.items()},
                                         activities={k: [move(a), move(b)] for k, (a, b) in r.activities.items()},
                                         cycle=None if r.cycle is None else move(r.cycle)) for r in self.responses]
        return dataclasses.replace(self, epoch_us=move(self.epoch_us), responses=responses, cycles=self.cycles + us,
                                   negotiations={k: [(move(a), move(b)) for a, b in v] for k, v in self.negotiations.items()},
                                   ready_marks={k: [(rank, move(x)) for rank, x in v] for k, v in self.ready_marks.items()},
                                   joins=[move(x) for x in self.joins])


def _load_events(path: str) -> list:
    text = read_input(path).decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:  # the writer was killed mid-event: keep every complete event
        cut = text.rfind("}")
        try:
            data = json.loads(text[:cut + 1] + "]") if cut > 0 else None
        except ValueError:
            data = None
        if data is None:
            raise DagprofError("not a Horovod timeline (not a JSON array of trace events), or truncated beyond repair", path) from None
    if isinstance(data, dict):
        data = data.get("traceEvents")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise DagprofError("not a Horovod timeline (expected a JSON array of trace events)", path)
    return data


def read_timeline(path: str | os.PathLike[str]) -> Timeline:
    path = os.fspath(path)
    events = _load_events(path)
    epoch = None
    tensor: dict[int, str] = {}
    stacks: dict[int, list[str]] = {}
    open_resp: dict[int, Response] = {}
    neg_open: dict[int, float] = {}
    responses: list[Response] = []
    cycles: list[float] = []
    negotiations: dict[str, list[tuple[float, float]]] = {}
    ready: dict[str, list[tuple[int, float]]] = {}
    problems: list[str] = []
    joins: list[float] = []
    cur: Response | None = None
    cur_sealed = True  # an activity or end was seen since the current response's starts
    for e in events:
        if not isinstance(e, dict):
            continue
        ph, pid, name = e.get("ph"), e.get("pid"), e.get("name", "")
        args = e.get("args") or {}
        if ph == "M":
            if "start_time_since_epoch_in_micros" in args:
                if epoch is not None:  # read before as one session, the second's responses paired with the first's
                    raise DagprofError("holds a second timeline session (start_time_since_epoch_in_micros again): one "
                                       "session per file", path)
                epoch = float(args["start_time_since_epoch_in_micros"])
            elif name == "process_name" and "name" in args:
                tensor[pid] = str(args["name"])
            continue
        try:
            ts = float(e["ts"])
        except (KeyError, TypeError, ValueError):
            continue
        if not 0 <= ts < float("inf"):  # NaN read as a time paired every span it opened or closed with nothing, unseen
            raise DagprofError(f"event {name!r} (ph {ph!r}) has ts {e['ts']!r}: a timeline's times are microseconds since its "
                               "start, finite and >= 0 (a damaged file)", path)
        if ph == "i":
            if name == "CYCLE_START":
                cycles.append(ts)
            continue
        t = tensor.get(pid, f"pid{pid}")
        stack = stacks.setdefault(pid, [])
        if ph == "B":
            if stack:  # an activity inside a response
                r = open_resp.get(pid)
                if r is not None:
                    span = r.activities.setdefault(name, [ts, ts])
                    span[0] = min(span[0], ts)
                    if r is cur:
                        cur_sealed = True
            elif name.startswith("NEGOTIATE_"):
                neg_open[pid] = ts
            else:
                if cur is None or cur_sealed or name.lower() != cur.op:
                    cur = Response(len(responses), name.lower(), [], cycle=cycles[-1] if cycles else None)
                    responses.append(cur)
                    cur_sealed = False
                cur.tensors.append(t)
                cur.start[t] = ts
                open_resp[pid] = cur
            stack.append(name)
        elif ph == "E":
            if not stack:
                if t.startswith("join."):  # Horovod writes an ``hvd.join()`` as an end alone, when the last rank joined
                    joins.append(ts)
                else:
                    problems.append(f"an end without a start for {t} at ts {ts:.0f}")
                continue
            opened = stack.pop()
            if opened.startswith("NEGOTIATE_"):
                negotiations.setdefault(t, []).append((neg_open.pop(pid, ts), ts))
            elif pid in open_resp:
                r = open_resp[pid]
                if r is cur:
                    cur_sealed = True
                if stack:
                    r.activities.setdefault(opened, [ts, ts])[1] = ts
                else:
                    r.end[t] = ts
                    r.dtype = str(args.get("dtype", r.dtype))
                    n = _shape_bytes(args)
                    if n:
                        r.nbytes[t] = n
                    del open_resp[pid]
        elif ph == "X" and stack and stack[-1].startswith("NEGOTIATE_") and str(name).isdigit():
            ready.setdefault(t, []).append((int(name), ts))
    if epoch is None:
        raise DagprofError("not a Horovod timeline (no start_time_since_epoch_in_micros on pid 0)", path)
    shift = lambda x: x + epoch  # noqa: E731
    for r in responses:
        r.start = {k: shift(v) for k, v in r.start.items()}
        r.end = {k: shift(v) for k, v in r.end.items()}
        r.activities = {k: [shift(a), shift(b)] for k, (a, b) in r.activities.items()}
        r.cycle = None if r.cycle is None else shift(r.cycle)
    unfinished = [r for r in responses if not r.complete]
    if unfinished:
        problems.append(f"{len(unfinished)} response(s) still running when the timeline ended (dropped)")
    return Timeline(
        path, epoch, [r for r in responses if r.complete], np.asarray(sorted(cycles), dtype=float) + epoch,
        {k: [(shift(a), shift(b)) for a, b in v] for k, v in negotiations.items()},
        {k: [(rank, shift(x)) for rank, x in v] for k, v in ready.items()}, problems, [shift(x) for x in joins],
    )


def _shape_bytes(args: dict) -> int:
    size = dtype_bytes(str(args.get("dtype", "")).lower().removeprefix("horovod_"))
    dims = re.findall(r"\d+", str(args.get("shape", "")))
    return size * int(np.prod([int(d) for d in dims])) if size and "shape" in args else 0
