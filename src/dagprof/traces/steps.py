"""Training steps: which ones (a window) and how long one takes (the iteration time).

Both are defined here once; the collector, the readers, the graph builder, the commands and
the demo call these.
"""
from __future__ import annotations

import numpy as np

from ..units import count

DEFAULT_STEPS = range(5, 10)
"""The window profiled when none is named: after DDP rebuilds its buckets (step 1) and the first steps warm up."""


def parse_steps(spec: str | int | range | tuple[int, int]) -> range:
    """A window of steps: ``"A:B"`` or ``(A, B)`` = steps A..B-1; ``"A"`` or ``A`` = step A alone; a ``range`` as is.

    One grammar for every flag and argument that names steps (``dagprof profile --steps``,
    ``dagprof analyze --steps``, ``dagprof.profile(steps=...)``), like a Python index and slice:
    a number is one step, ``A:B`` a half-open window. Raises ``ValueError`` with the reason.
    """
    if isinstance(spec, range):
        window = spec
    elif isinstance(spec, bool):
        raise ValueError(f"steps must be A:B or A, got {spec!r}")
    elif isinstance(spec, int):
        window = range(spec, spec + 1)
    elif isinstance(spec, str):
        first, sep, stop = spec.strip().partition(":")
        try:
            window = range(int(first), int(stop) if sep else int(first) + 1)
        except ValueError:
            raise ValueError(f"steps take A:B (steps A..B-1) or A (step A alone), got {spec!r}") from None
    else:
        first, stop = spec
        window = range(int(first), int(stop))
    if window.step != 1 or window.start < 0 or len(window) == 0:
        raise ValueError(f"steps must be a non-empty window of consecutive steps >= 0, got {spec!r}")
    return window


def step_range(steps: list[int]) -> str:
    """The steps a graph or profile holds as the reports print them: first..last ("?" for none)."""
    return f"{steps[0]}..{steps[-1]}" if steps else "?"


def iteration_us(steps: np.ndarray | list) -> float:
    """The iteration time: the MEAN time per step over a window, start of one step to start of the next.

    ``steps``: rows ``(step, start, end)`` (any one time unit; the result is in it), or, for steps
    timed back to back by a training loop's own timer, just their durations.

    Why the mean: a job's throughput is steps over wall time, so the time it pays per step is the
    mean; a slow step (a straggler, a collector pause) is real cost, and the replay, which keeps
    every profiled step, predicts it too, so measured and predicted compare like with like. A
    median would hide exactly the steps dagprof is asked to explain. Why start to start: the gap
    between one step's end and the next step's start (data loading outside the step marker) is part
    of the iteration, and the replay keeps those gaps. The last step counts to its own end; a step
    whose successor is not in ``steps`` likewise. Warm-up is excluded by choosing the window, and
    noise between repeated runs by comparing several runs, not by a robust statistic here.
    """
    a = np.asarray(steps, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no steps to time")
    return float(step_periods(a)[1].mean())


def step_periods(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(step numbers, each step's time) as ``iteration_us`` counts them: start to the next step's start, else to its end."""
    if a.ndim == 1:
        return np.arange(len(a)), a
    a = a[np.argsort(a[:, 0], kind="stable")]
    period = a[:, 2] - a[:, 1]
    follows = a[1:, 0] == a[:-1, 0] + 1
    period[:-1][follows] = a[1:, 1][follows] - a[:-1, 1][follows]
    return a[:, 0].astype(int), period


STALL_FACTOR = 100.0
"""A step this many times the job's median step is no straggler of the same loop but a stall, a hang, a sleep or a
clock jump (two profiler sessions in one trace): it is kept (the mean is the job's cost), but said, since it alone sets
the iteration time. Stragglers and collector pauses measured on the testbeds stay within a few times the median."""


def stalled_steps(spans: dict[int, np.ndarray]) -> str | None:
    """A warning when some steps ``(step, start, end)`` of the ranks (rank -> its rows) last over ``STALL_FACTOR`` times
    the median step of them all (all ranks pooled: a rank with two steps in the window has no median of its own), or,
    for two ranks of one step each, the shorter. One rank's two steps are not judged: the last of a window is often
    cut short by the profiler's end (a public ROCm trace: 9.3 ms, then 49 us)."""
    periods = {r: step_periods(np.asarray(a, dtype=np.float64)) for r, a in spans.items() if len(a)}
    pooled = np.concatenate([p for _, p in periods.values()]) if periods else np.array([])
    median = float(np.median(pooled)) if len(pooled) >= 3 else float(pooled.min()) if len(periods) == 2 == len(pooled) else 0.0
    if not median > 0:
        return None
    slow = [(float(p[i]), r, int(s[i])) for r, (s, p) in periods.items() for i in np.flatnonzero(p > STALL_FACTOR * median)]
    if not slow:
        return None
    us, rank, step = max(slow)
    return (f"{len(slow)} of {len(pooled)} rank steps last over {STALL_FACTOR:.0f}x the median step (rank {rank}, step {step}: "
            f"{us / 1e6:.1f} s against {median / 1e3:.1f} ms): a stall, a sleep or a second profiler session; the "
            "iteration time is the mean with them: choose --steps without them")


def time_between_steps(spans: dict[int, np.ndarray]) -> str | None:
    """A warning when, on some rank, the time from one step's end to the next step's start (outside every step marker)
    exceeds the median step's own time: ``iteration_us`` counts it in the step before, as the loop paid it, and the
    replay keeps it as host idle time, so ``analyze`` calls it framework overhead. A JAX loop's evaluation pass every 8
    steps (a program compiled at its first call, 3.4 s between two 250 ms steps) made a window's iteration 680 ms and
    its critical path 466 ms of "framework overhead", unsaid."""
    gaps = []
    for r, a in spans.items():
        a = np.asarray(a, dtype=np.float64)
        if len(a) < 2:
            continue
        a = a[np.argsort(a[:, 0], kind="stable")]
        follows = a[1:, 0] == a[:-1, 0] + 1
        gap = np.where(follows, a[1:, 1] - a[:-1, 2], 0.0)
        gaps += [(float(g), r, int(a[i, 0]), float(np.median(a[:, 2] - a[:, 1]))) for i, g in enumerate(gap.tolist())]
    median = float(np.median([m for *_, m in gaps])) if gaps else 0.0
    long = [g for g in gaps if median > 0 and g[0] > median]
    if not long:
        return None
    us, rank, step, _ = max(long)
    verb = "exceeds" if len(long) == 1 else "exceed"
    return (f"{count(len(long), 'time')} between two steps, outside every step marker, {verb} the median step (rank {rank}: "
            f"{us / 1e3:.0f} ms after step {step}, against {median / 1e3:.1f} ms; an evaluation, a checkpoint or a compile "
            "between steps?): the iteration time counts it in the step before, and analyze as framework overhead; "
            "choose --steps without it")

