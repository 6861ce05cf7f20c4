"""All ranks on one clock in one Perfetto trace: the measured timeline, aligned.

It lives in ``report`` (not ``align``) because it writes through the one Chrome writer,
which sits in this layer; alignment itself is ``dagprof.align.clocks``.
"""
from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from ..align.clocks import ClockAlignment
from ..align.one_clock import alignment_of, on_one_clock
from ..traces.events import Kind, Run
from .chrome_trace import Slice, rows, write_chrome_trace


def _slices(run: Run, origin_ns: int) -> Iterator[Slice]:
    kinds = [k.name for k in Kind]
    for t in run.ranks:
        ev = t.events
        shift = (t.base_ns - origin_ns) / 1000.0
        process = f"rank {t.rank}"
        lanes = [lane.name for lane in t.lanes]

        def cols(o: np.ndarray, ev=ev, shift=shift) -> tuple[np.ndarray, ...]:
            return ev.start[o] + shift, ev.dur[o], ev.kind[o], ev.group[o], ev.seq[o], ev.nbytes[o], ev.step[o], ev.lane[o], ev.name[o]

        for start, dur, kind, group, seq, nbytes, step, lane, name in rows(np.argsort(ev.start, kind="stable"), cols):
            args: dict = {"kind": kinds[kind]}
            if group >= 0:
                args.update(group=t.groups[group], seq=seq, nbytes=nbytes)
            if step >= 0:
                args["step"] = step
            yield Slice(process, lanes[lane], ev.names[name], start, dur, args, kinds[kind])


def write_merged_trace(path: str | os.PathLike[str], run: Run) -> tuple[str, ClockAlignment | None]:
    """Write every rank's events on one clock (aligned on matched collectives, once: a run already aligned stays)."""
    run, _ = on_one_clock(run)
    alignment = alignment_of(run)
    origin = min(t.base_ns for t in run.ranks)
    meta = {"source": run.source, "ranks": [t.rank for t in run.ranks], "origin_unix_ns": origin}
    if alignment is not None:
        meta["clock_offset_us"] = {str(r): o for r, o in alignment.offset_us.items()}
        meta["residual_skew_us"] = alignment.residual_us
    return write_chrome_trace(path, _slices(run, origin), meta), alignment
