"""Horovod's trace log (``HOROVOD_LOG_LEVEL=trace``) -> each rank's own start and end of every response it performed.

Horovod 0.28 writes its timeline on the coordinator alone. At the trace level every rank's background thread logs
``[R]: Performing NAMES`` and ``[R]: Finished performing NAMES`` around each response (horovod/common/operations.cc,
``PerformOperation``), stamped with its wall clock in local time to the microsecond, space-padded
(``[2026-12-05 03:23:45.  4236: T .../operations.cc:833] [1]: Finished performing allreduce.fc.weight``). Those ends
say when each peer left a response, which rank 0's timeline cannot: after a large response a peer still receiving its
tail holds rank 0's next negotiation (``traces.horovod``: the wire in a ``horovod negotiate`` span). The collector
(``collect.hooks.horovod_log``) keeps a rank's lines of the profiled window in ``rank<R>.horovod.log``.
"""
from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass

from ..errors import DagprofError
from ..fsutil import read_input

LOG_FILE = "rank{rank}.horovod.log"
_STAMP = r"\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.\s*(\d{1,6}): "
# any line Horovod's logger wrote: its threads write to one stream at once, so a line may have lost its "[" to the one before
HOROVOD_LINE = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.[ \d]{6}: ([TDIWEF]) \S+:\d+\] ")
_PERFORM = re.compile(_STAMP + r"T [^\]]*\] \[(\d+)\]: (Performing|Finished performing) (.+?)\s*$")
# in every line about performing a response, and in a line cut inside one: the collector keeps, the reader reads these
RESPONSE_MARK = "erf"


@dataclass(frozen=True)
class LoggedResponse:
    """One response as a rank's background thread performed it, in epoch us of that rank's clock."""

    tensors: frozenset[str]
    start_us: float
    end_us: float


@dataclass
class RankLog:
    rank: int
    responses: list[LoggedResponse]
    unreadable: int  # lines about performing a response that did not parse (cut or interleaved)
    unpaired: int  # a start without its end or an end without its start beyond the window's two edges


def read_log(path: str, rank: int, utc_offset_s: int) -> RankLog:
    """A rank's kept log lines -> its responses; ``utc_offset_s``: the recording host's local time offset, which the
    stamps are in (``time.localtime().tm_gmtoff``, the rank file keeps it)."""
    lines = read_input(path).decode("utf-8", errors="replace").splitlines()
    started: dict[frozenset[str], float] = {}
    out: list[LoggedResponse] = []
    unreadable = ends_alone = starts_lost = 0
    for line in lines:
        if RESPONSE_MARK not in line:  # Performing, Finished performing, or a line cut inside either (a cut sooner: unpaired)
            continue
        m = _PERFORM.search(line)
        if m is None:
            unreadable += 1
            continue
        stamp, micros, who, what, names = m.groups()
        if int(who) != rank:
            raise DagprofError(f"holds rank {who}'s lines, not rank {rank}'s (another rank's log?)", path)
        at = (calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) - utc_offset_s) * 1e6 + int(micros)
        tensors = frozenset(t.strip() for t in names.split(","))
        if what == "Performing":
            starts_lost += tensors in started  # its end's line lost: the earlier start would pair with a later end
            started[tensors] = at
        elif tensors in started:
            out.append(LoggedResponse(tensors, started.pop(tensors), at))
        else:
            ends_alone += 1
    return RankLog(rank, out, unreadable, starts_lost + max(ends_alone - 1, 0) + max(len(started) - 1, 0))


def read_logs(paths: dict[int, str | None], utc_offsets: dict[int, int | None]) -> dict[int, RankLog]:
    """Every rank's log (rank -> its path, as its rank file names it) where each rank kept one and said its time zone;
    else none (a run recorded without the trace level, or before 2026-12-05)."""
    if not paths or any(path is None or utc_offsets.get(r) is None for r, path in paths.items()):
        return {}
    return {r: read_log(path, r, int(utc_offsets[r])) for r, path in paths.items()}
