"""Training steps: which ones (a window) and how long one takes (the iteration time).

Both are defined here once; the collector, the readers, the graph builder, the commands and
the demo call these.
"""
from __future__ import annotations

import numpy as np

from ..units import count
from .meta import CutStep

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
    """The steps a graph or profile holds as the reports print them: first..last, a lone step by itself ("?" for none)."""
    return "?" if not steps else str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"


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


def cut_step(start: np.ndarray, end: np.ndarray, is_step: np.ndarray, step: np.ndarray, resolution_us: float,
             loop: np.ndarray | None = None, work: np.ndarray | None = None, names: list[str] | None = None) -> CutStep | None:
    """The trace's last step (by its marker's end) when the trace's end cut inside it: nothing of the trace ends after the
    marker, and either ops that began inside the step (host or device) end where the marker ends (to ``resolution_us``),
    or the step's ops on the loop's thread are the first ones of every earlier step's there, in the same order, and fewer,
    or none of them is the op that every earlier step's ops there end on (``loop``: per row, the name id in ``names`` of a
    top-level op on that thread, -1 elsewhere).

    A cut closes the marker and every op still open at one instant; a whole step's host ops end before its marker, which
    ``profiler.step()`` closes from Python between ops, and its device work runs past it or ends before. A cut while the
    host was between ops and the device idle leaves no open op, but the loop's ops stop part-way through the sequence its
    steps repeat: 8 of 9 such cuts in tests/data and ../shared/data (``bench/cut_tells.py``); the ninth's two steps differ
    from their 5th op on (its whole last step holds 836 ops against 1085, so no count tells either), but its cut half
    never ran the op that its whole steps end on (Adam's ``aten::addcdiv_``): the end tell. A last op unlike the earlier
    steps' alone would tell a whole step of an event-sampled trace. A last step of no op there after steps of some is
    one, whatever ends after it (``profiler.step()`` after the loop's last step opened it, ``stop()`` closed it: a
    public MI250 trace's 49 us after 9.3 ms, its device work of the step before ending 0.2 ms later, answered 4.69 ms
    an iteration). No other whole trace in tests/data and ../shared/data holds these tells, but a ``no_sync`` step after
    a synchronising one is such a start too (and never runs the optimizer's last op), so the graph builder says the
    loop-op tells, leaves an empty last step out of a default window (``completeness.leave_out_empty_last``) and refuses
    the rest (``completeness.refuse_cut_steps``). Rows: the rank's events, the step markers' mask and their step
    numbers."""
    marks = np.flatnonzero(is_step)
    if not len(marks):
        return None
    last = marks[np.argmax(end[marks])]
    s, e = start[last], end[last]
    after = bool((end > e + resolution_us).any())
    ops = int((~is_step & (start >= s) & (start < e - resolution_us) & (np.abs(end - e) <= resolution_us)).sum())
    if ops and not after:
        return CutStep(int(step[last]), ops)
    earlier = sorted(set(step[marks].tolist()) - {step[last]})
    short = None if loop is None else _cut_short(start, step, loop, int(step[last]), earlier)
    if short is not None and (short.ops == 0 or not after):
        return short
    worked = set() if work is None else set(step[work].tolist())
    if earlier and set(earlier) <= worked and int(step[last]) not in worked:
        return CutStep(int(step[last]), 0, like=earlier[-1], idle=True)
    return None if loop is None or after else _cut_before_end(start, step, loop, int(step[last]), earlier, names)


def _loop_ops(start: np.ndarray, step: np.ndarray, loop: np.ndarray, s: int) -> np.ndarray:
    """Step ``s``'s loop ops (``cut_step``'s ``loop``), in the order they began."""
    rows = np.flatnonzero((step == s) & (loop >= 0))
    return loop[rows[np.argsort(start[rows], kind="stable")]]


def _cut_short(start: np.ndarray, step: np.ndarray, loop: np.ndarray, last: int, earlier: list[int]) -> CutStep | None:
    """``last`` as a step cut short (``cut_step``): its loop ops a strict start of each ``earlier`` step's, else None."""
    mine, before = _loop_ops(start, step, loop, last), [_loop_ops(start, step, loop, s) for s in earlier]
    if not before or not all(len(mine) < len(b) and np.array_equal(b[:len(mine)], mine) for b in before):
        return None
    return CutStep(last, len(mine), like=earlier[-1], of=len(before[-1]))


def _cut_before_end(start: np.ndarray, step: np.ndarray, loop: np.ndarray, last: int, earlier: list[int],
                    names: list[str] | None) -> CutStep | None:
    """``last`` as a step cut before its end (``cut_step``): some loop ops, none of them the one op that every ``earlier``
    step's end on (``CutStep.ended``: its name in ``names``), else None."""
    mine, before = _loop_ops(start, step, loop, last), [_loop_ops(start, step, loop, s) for s in earlier]
    ends = {int(b[-1]) for b in before if len(b)}
    if not len(mine) or len(ends) != 1 or not all(len(b) for b in before) or ends & set(mine.tolist()):
        return None
    end = ends.pop()
    return CutStep(last, len(mine), like=earlier[-1], of=len(before[-1]), ended=names[end] if names else str(end))


def one_step(steps: list[int]) -> str | None:
    """A warning when the answer rests on one step: a step the trace's end cut inside reads as a whole, shorter one unless
    something tells (``cut_step``), and one step has no spread to give an interval."""
    if len(steps) != 1:
        return None
    return (f"the answer rests on 1 step (step {steps[0]}): one step cannot show that it is whole (a trace cut inside its "
            "step reads as a shorter step) nor how steps vary; profile 3 or more steps")


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


def long_gaps(spans: dict[int, np.ndarray]) -> tuple[list[tuple[float, int, int]], float]:
    """The times from one step's end to the next step's start (outside every step marker) that exceed the median step's
    own time, on any rank (rank -> its rows ``(step, start, end)``): ``(us, rank, step before)`` each, and that median."""
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
    return [(us, r, s) for us, r, s, _ in gaps if median > 0 and us > median], median


def time_between_steps(spans: dict[int, np.ndarray]) -> str | None:
    """A warning when, on some rank, the time from one step's end to the next step's start (outside every step marker)
    exceeds the median step's own time (``long_gaps``): ``iteration_us`` counts it in the step before, as the loop paid
    it, and the replay keeps it as host idle time, so ``analyze`` calls it framework overhead. A JAX loop's evaluation pass
    every 8 steps (a program compiled at its first call, 3.4 s between two 250 ms steps) made a window's iteration 680 ms
    and its critical path 466 ms of "framework overhead", unsaid. A window chosen by default leaves it out
    (``steady_window``); this is said where ``--steps`` kept it."""
    long, median = long_gaps(spans)
    if not long:
        return None
    us, rank, step = max(long)
    verb = "exceeds" if len(long) == 1 else "exceed"
    return (f"{count(len(long), 'time')} between two steps, outside every step marker, {verb} the median step (rank {rank}: "
            f"{us / 1e3:.0f} ms after step {step}, against {median / 1e3:.1f} ms; an evaluation, a checkpoint or a compile "
            "between steps?): the iteration time counts it in the step before, and analyze as framework overhead; "
            "choose --steps without it")


def steady_window(spans: dict[int, np.ndarray], steps: list[int]) -> tuple[list[int], str | None]:
    """The longest stretch of consecutive ``steps`` (the first of equals) whose iterations hold no time between two steps
    over the median step (``long_gaps``: an evaluation's compile, a checkpoint), and the line that says what was left out;
    ``steps`` and None where none holds one.

    Such a time is no cost of the steps the model repeats: the averaged replay spread a JAX evaluation's 1.8 s compile
    between steps 7 and 8 over every step of the window, on each rank's step mark and on the first op of a thread's work
    after it, and replayed +45 % (``bench/frameworks/jax_wavenet_lion.py``, window 6:14); the model the what-ifs start
    from was +6.4 % and the profiler-cost correction held loop step times without it against an iteration with it. The
    step before the time counts it (start to start, ``iteration_us``), unless it ends the stretch (then it counts to its
    own end), so a stretch ends at such a step: 6..7 and 8..13 there, 8..13 kept. A time that only some ranks took
    (rank 0's evaluation) is waited out by the others inside the next step's first collective, so that step is left
    out too where a rank without the time ran it longer than one that took it by over half that time (a wait's
    signature; the load's level moves both): a PINN's 237 ms check on rank 0 after step 7 made rank 1's step 8 352 ms
    against ~33, the window's mean step 89 ms for ~36 and its averaged replay +13.7 %
    (``bench/frameworks/jax_pinn_poisson.py``; on a busier run, 222 ms against 26 where the median step was 133). Where
    such times recur (twice or more, after a third of the steps or more), they are the loop's own (a data loader or
    logging outside the step markers), and every step is kept."""
    chosen = {r: a[np.isin(a[:, 0].astype(int), steps)] for r, a in spans.items()}
    long, median = long_gaps(chosen)
    holds = {s for _, _, s in long}
    if not holds or (len(holds) >= 2 and 3 * len(holds) >= len(steps) - 1):
        return steps, None
    took = {(r, s): us for us, r, s in long}
    length = {(r, int(row[0])): row[2] - row[1] for r, a in chosen.items() for row in a}
    waited = {s + 1 for (r, s), us in took.items() for (o, x), d in length.items()
              if x == s + 1 and (o, s) not in took and d - length.get((r, x), d) > us / 2}
    stretches: list[list[int]] = [[]]
    for s in sorted(steps):
        prev = stretches[-1][-1] if stretches[-1] else None
        if prev is not None and (s != prev + 1 or prev in holds or s in waited or prev in waited):
            stretches.append([])
        stretches[-1].append(s)
    kept = max(stretches, key=len)
    us, rank, step = max(long)
    left = [s for s in steps if s not in kept]
    others = [s for s in sorted(waited) if s in left]
    waits = (f"; the other ranks waited it out in step{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}, "
             "left out too" if others else "")
    return kept, (f"{count(len(left), 'step')} left out of the window ({', '.join(step_range(x) for x in stretches if x is not kept)}): "
                  f"{count(len(holds), 'iteration')} of it held time between two steps, outside every step marker, over the "
                  f"median step (rank {rank}: {us / 1e3:.0f} ms after step {step}, against {median / 1e3:.1f} ms; an "
                  f"evaluation, a checkpoint or a compile between steps?), which no step repeats{waits}: steps "
                  f"{step_range(kept)} kept; --steps chooses the window, that time included")


def resynced_steps(enqueues: dict[int, np.ndarray], steps: list[int]) -> tuple[dict[int, int], int]:
    """Steps of ``steps`` that all-reduced DDP's gradient buckets more often than most steps, and how often, with that
    usual count; ``enqueues``: per rank, rows of (step, bucket) of each bucket's enqueue.

    An optimizer step not taken ends no step (dagprof counts optimizer steps), so the iteration before it and the next
    fold into one step of two synchronising backward passes: a ``GradScaler`` skipping a step whose fp16 gradients
    overflowed does so (``bench/ddp_fresh/capsnet_scaler.py --growth-interval 1``). A job that syncs twice in every step
    (two losses, SAM) has no step over its usual count; ``no_sync`` passes enqueue nothing, so accumulation reads alike."""
    rounds: dict[int, int] = {}
    for a in enqueues.values():
        a = a[np.isin(a[:, 0], steps)] if len(a) else a
        if not len(a):
            continue
        buckets = np.unique(a[:, 1])
        for s in np.unique(a[:, 0]).tolist():
            per_bucket = a[a[:, 0] == s, 1]
            n = int(min(np.count_nonzero(per_bucket == b) for b in buckets))
            rounds[int(s)] = max(rounds.get(int(s), 0), n)
    if len(rounds) < 2:
        return {}, 1
    usual = int(np.argmax(np.bincount(list(rounds.values()))))
    return {s: n for s, n in sorted(rounds.items()) if n > usual}, usual


def say_resynced(extra: dict[int, int], usual: int, left_out: bool) -> str:
    """The line ``resynced_steps``' steps get: left out of a default window (``left_out``), else kept as named."""
    where = ", ".join(f"step {s} ({n}x)" for s, n in extra.items())
    fate = "left out of the window" if left_out else "kept as --steps named them: each counts as one iteration"
    return (f"{count(len(extra), 'step')} all-reduced DDP's gradient buckets more often than the window's others ({usual}x): "
            f"{where}; an optimizer step not taken (a GradScaler skipping a step whose gradients overflowed?) folds two "
            f"iterations into one step; {fate}")
