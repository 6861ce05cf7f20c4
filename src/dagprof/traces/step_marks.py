"""Iterations of a trace that has no ``ProfilerStep#N`` markers.

Benchmarks, inference servers and autograd-API samples are profiled without ``torch.profiler``'s
schedule, so their traces carry no step markers. Two ways to still replay them:
- a user-named marker (``--step-marker NAME``): every event called ``NAME`` (or ``NAME#N``, the
  way ``ProfilerStep#N`` is spelled) opens one iteration, exactly as ``ProfilerStep`` does;
- otherwise the whole profiled window is one iteration (step 0), measured from the first event's
  start to the last event's end on any lane.
Both run after parsing, on the normalised ``RankTrace``, so a cached parse serves every choice.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from ..errors import DagprofError
from .events import Dep, EventRows, Kind, Lane, LaneKind, RankTrace, Run

WINDOW_STEP_NAME = "profiled window"


def mark_steps(run: Run, marker: str | None = None) -> Run:
    """``run`` with iterations on every rank: ``marker``'s events, its own ProfilerSteps, or the window."""
    if marker:
        ranks = [with_marker(t, marker) for t in run.ranks]
        if not any((t.events.kind == Kind.STEP).any() for t in ranks):
            raise DagprofError(f"no event named {marker!r} (or {marker}#N) to mark steps with (--step-marker)", run.source)
        return dataclasses.replace(run, ranks=ranks)
    if all((t.events.kind == Kind.STEP).any() for t in run.ranks):
        return run
    ranks = [t if (t.events.kind == Kind.STEP).any() else as_one_window(t) for t in run.ranks]
    note = "no ProfilerStep markers: the whole profiled window replays as one iteration (--step-marker NAME to use your own)"
    return dataclasses.replace(run, ranks=ranks, meta=run.meta.warned(note))


def refuse_mixed_markers(run: Run) -> None:
    """Some ranks with step markers and some without are not one job's profile: their collectives, numbered by step,
    would match nothing ("mismatched collectives", naming neither file)."""
    marked = [bool((t.events.kind == Kind.STEP).any()) for t in run.ranks]
    if any(marked) and not all(marked):
        bare = [t.source for t, m in zip(run.ranks, marked) if not m]
        raise DagprofError(f"no ProfilerStep markers, but {sum(marked)} other rank(s) have them ({len(bare)} rank(s) without): "
                           "a damaged trace, or a profile of another kind", bare[0])


def with_marker(trace: RankTrace, marker: str) -> RankTrace:
    """Events named ``marker`` (or ``marker#N``) become the step markers; ProfilerSteps stop being ones."""
    ev = trace.events
    pattern = re.compile(rf"^{re.escape(marker)}(?:#(\d+))?$")
    matches = [pattern.match(s) for s in ev.names]
    is_marker = np.array([m is not None for m in matches], dtype=bool)[ev.name] if len(ev) else np.zeros(0, bool)
    rows = np.flatnonzero(is_marker & ~_gpu_rows(trace))
    kind, depth = ev.kind.copy(), ev.depth.copy()
    kind[kind == Kind.STEP] = Kind.OTHER
    if not len(rows):
        return dataclasses.replace(trace, events=dataclasses.replace(ev, kind=kind))
    lane = int(np.bincount(ev.lane[rows]).argmax())  # the thread that runs the loop
    rows = rows[ev.lane[rows] == lane]
    rows = rows[np.lexsort((-ev.dur[rows], ev.start[rows]))]
    outer = ev.start[rows] >= np.r_[-np.inf, np.maximum.accumulate(ev.end[rows])[:-1]]
    rows = rows[outer]  # a marker nested in another of its name (a range opened twice) is part of that step
    for r in rows.tolist():  # the marker's own children move up one level, as under a ProfilerStep range
        if depth[r] >= 0:
            inside = (ev.lane == lane) & (ev.start >= ev.start[r]) & (ev.end <= ev.end[r]) & (depth > depth[r])
            depth[inside] -= 1
    numbers = [matches[int(ev.name[r])].group(1) for r in rows.tolist()]
    step_no = np.array([int(x) for x in numbers]) if all(numbers) else np.arange(len(rows))
    kind[rows] = Kind.STEP
    depth[rows] = -1
    events = dataclasses.replace(ev, kind=kind, depth=depth, step=_steps_by_window(trace, ev.start[rows], ev.end[rows], step_no, rows))
    return dataclasses.replace(trace, events=events, lanes=_with_main(trace.lanes, lane))


def as_one_window(trace: RankTrace) -> RankTrace:
    """One step (0) spanning the whole trace, marked on the main thread (the first CPU lane when none is)."""
    ev = trace.events
    if not len(ev):
        return trace
    lane = next((i for i, x in enumerate(trace.lanes) if x.main), None)
    if lane is None:
        lane = next((i for i, x in enumerate(trace.lanes) if x.kind != LaneKind.GPU_STREAM), 0)
    t0, t1 = float(ev.start.min()), float(ev.end.max())
    rows = EventRows.extending(ev)
    rows.add(WINDOW_STEP_NAME, Kind.STEP, lane, t0, t1 - t0, depth=-1)
    rows.columns()["step"][:] = 0
    events = rows.table()
    return dataclasses.replace(trace, events=events, lanes=_with_main(trace.lanes, lane))


def _gpu_rows(trace: RankTrace) -> np.ndarray:
    gpu_lane = np.array([x.kind == LaneKind.GPU_STREAM for x in trace.lanes] + [False], dtype=bool)
    return gpu_lane[trace.events.lane]


def _steps_by_window(trace: RankTrace, s_start: np.ndarray, s_end: np.ndarray, s_num: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """Host work belongs to the window it starts in; GPU work to the step of the call that launched it."""
    ev = trace.events
    step = np.full(len(ev), -1, dtype=np.int32)
    k = np.searchsorted(s_start, ev.start, side="right") - 1
    inside = (k >= 0) & (ev.start < s_end[np.maximum(k, 0)])
    step[inside] = s_num[k[inside]]
    step[marks] = s_num
    if len(trace.flows):
        launch = trace.flows[trace.rules() == Dep.LAUNCH] if len(trace.flow_rule) else trace.flows
        gpu = _gpu_rows(trace)
        launch = launch[gpu[launch[:, 1]] & ~gpu[launch[:, 0]]]
        step[launch[:, 1]] = step[launch[:, 0]]
    return step


def _with_main(lanes: list[Lane], main: int) -> list[Lane]:
    return [dataclasses.replace(x, main=i == main) for i, x in enumerate(lanes)]
