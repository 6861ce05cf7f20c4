"""Which ranks of the job a run lacks, or holds cut short, and the one rule for such a run.

Readers list what they know is missing in ``run.meta.rank_gaps`` (a ``RankGap`` per rank:
a rank without a file, a rank killed inside its profiled window). ``require_complete`` then
refuses the run in one line that names every gap, or, when the caller opts in
(``--allow-missing-ranks``), keeps it with a warning that counts them and ``meta.partial``,
which every output carries. A run that lacks a rank is never analysed as if it were the job.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os

import msgspec
import numpy as np

from ..errors import DagprofError
from .events import Kind, RankTrace, Run
from .meta import RankGap

OPT_IN = "--allow-missing-ranks"
SAME_JOB_SLACK_NS = 30 * 10**9  # clocks of different hosts may disagree by seconds


def check_same_job(ranks: list[RankTrace], folder: str) -> None:
    """Synchronous data parallelism runs a step on all ranks at once: windows (the profiled steps, else every event)
    that do not overlap are different runs, whichever format the rank files are in (``check_same_windows``)."""
    spans = []
    for t in ranks:
        s = t.step_spans()
        first, last = (s[0, 1], s[-1, 2]) if len(s) else (t.events.start.min(initial=0.0), t.events.end.max(initial=0.0))
        spans.append(Window(t.base_ns + int(first * 1e3), t.base_ns + int(last * 1e3), t.host, t.source))
    check_same_windows(spans, folder)


@dataclasses.dataclass(frozen=True)
class Window:
    """One rank's recorded time (epoch ns), its host and its file."""

    start_ns: int
    end_ns: int
    host: str
    source: str


def check_same_windows(spans: list[Window], folder: str) -> None:
    """Ranks whose windows do not overlap (beyond clock slack) are of different runs: refused naming the two files."""
    by_host: dict[str, list[Window]] = {}
    for w in spans:
        if w.host:
            by_host.setdefault(w.host, []).append(w)
    # ranks of one host share its clock: a window a step or a second off at most (19 s apart was two recordings of a job)
    groups = [(spans, SAME_JOB_SLACK_NS)] + [(g, 10**9 + max(w.end_ns - w.start_ns for w in g)) for g in by_host.values()]
    for group, slack in groups:
        if len(group) > 1:
            _refuse_apart(group, slack, folder)


def refuse_copies(ranks: list[RankTrace], folder: str) -> None:
    """Two ranks with the same events at the same times are one rank's trace twice: a copy of its file, for a format whose
    trace names no rank (an XPlane beside a rank file that says the rank; MXNet's reader checks its spans as read,
    ``mxnet._refuse_copy``). Two processes never time every op alike; the step marks, which a reader may take from
    elsewhere (a manifest), are left out."""
    seen: dict[bytes, RankTrace] = {}
    for t in ranks:
        ev = t.events
        keep = ev.kind != Kind.STEP
        if not keep.any():
            continue
        at = t.base_ns + np.round(ev.start[keep] * 1e3).astype(np.int64)
        digest = hashlib.sha256(at.tobytes() + np.round(ev.dur[keep] * 1e3).astype(np.int64).tobytes()).digest()
        other = seen.setdefault(digest, t)
        if other is not t:
            raise DagprofError(f"holds the same events at the same times as {os.path.relpath(other.source, folder)} (rank {other.rank}): "
                               f"a copy of that rank's trace, not rank {t.rank}'s; profile the job again", t.source)


def _refuse_apart(spans: list[Window], slack_ns: int, folder: str) -> None:
    latest_start = max(spans, key=lambda w: w.start_ns)
    earliest_end = min(spans, key=lambda w: w.end_ns)
    if latest_start.start_ns - earliest_end.end_ns > slack_ns:
        raise DagprofError(
            f"{os.path.relpath(earliest_end.source, folder)} and {os.path.relpath(latest_start.source, folder)} were recorded "
            f"{(latest_start.start_ns - earliest_end.end_ns) / 1e9:.0f} s apart: they are from different runs (or their hosts' clocks "
            "are that far apart)", folder)


def spans(values: list[int] | tuple[int, ...]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    out: list[str] = []
    for v in sorted(values):
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def describe(gaps: list[RankGap], world_size: int) -> str:
    """One phrase for all gaps: ranks with the same reason together (a job of 4,096 ranks stays one line)."""
    by_why: dict[str, list[int]] = {}
    for g in gaps:
        key = g.why + (f": steps {spans(g.steps_missing)} missing" if g.steps_missing else "")
        by_why.setdefault(key, []).append(g.rank)
    parts = [f"rank{'s' if len(r) > 1 else ''} {spans(r)} of {world_size}: {why}" for why, r in by_why.items()]
    return "; ".join(parts)


def lone_rank(run: Run) -> Run:
    """A single trace file of one rank of a larger job: the user named that file, so it is read, but the output says that
    it is one rank of how many (a warning, ``meta.partial``), and the what-ifs, which re-price collectives across every
    rank, refuse it (``refuse_lone_rank``)."""
    if len(run.ranks) != 1 or run.world_size <= 1:
        return run
    t = run.ranks[0]
    note = (f"one trace file: rank {t.rank} of a {t.world_size}-rank job, the other {t.world_size - 1} rank(s) not read "
            "(its collectives keep this rank's measured times); a folder of every rank's trace analyses the job")
    return dataclasses.replace(run, meta=msgspec.structs.replace(run.meta.warned(note), partial=True))


def refuse_lone_rank(run: Run, what: str) -> None:
    """One line instead of a prediction for the whole job from one rank's trace file."""
    if len(run.ranks) == 1 and run.world_size > 1 and not os.path.isdir(run.source):
        t = run.ranks[0]
        raise DagprofError(f"holds rank {t.rank} of a {t.world_size}-rank job alone: {what} needs every rank's trace; "
                           "give the folder that holds them", run.source)


def require_complete(run: Run, allow_missing_ranks: bool = False) -> Run:
    """``run`` when no rank is missing or cut; else a one-line refusal, or (opted in) a warned, partial run."""
    gaps = run.meta.rank_gaps
    if not gaps:
        return run
    world = max(run.world_size, max(g.rank for g in gaps) + 1)
    text = describe(gaps, world)
    whole = sum(g.missing_whole for g in gaps)
    if not allow_missing_ranks:
        raise DagprofError(f"incomplete profile: {text}; pass {OPT_IN} to analyse the ranks and steps that are here", run.source)
    counts = [f"{n} of {world} ranks {what}" for n, what in ((whole, "missing"), (len(gaps) - whole, "cut short")) if n]
    note = f"partial analysis ({OPT_IN}): {' and '.join(counts)}, only the steps every rank has are used ({text})"
    return dataclasses.replace(run, meta=msgspec.structs.replace(run.meta.warned(note), partial=True))


def leave_out_empty_last(run: Run, steps: list[int]) -> tuple[list[int], list[str]]:
    """A default window less a last step that holds none of the loop's ops (``CutStep.ops`` 0 beside earlier steps): the
    loop's last ``profiler.step()`` opened it and ``stop()`` closed it, as a loop that ends inside the profiler's schedule
    leaves it (``tests/data/cut-steps/empty-last-step``, a public MI250 trace), so it is no step of the job: left out and
    said, not refused. A ``--steps`` that names it, or a window of it alone, is refused (``refuse_cut_steps``)."""
    ranks = [t for t in run.ranks if t.meta.cut_step is not None and t.meta.cut_step.ops == 0 and t.meta.cut_step.like >= 0]
    empty = {t.meta.cut_step.step + t.meta.step_offset for t in ranks}
    kept = [s for s in steps if s not in empty]
    if len(kept) == len(steps) or not kept:
        return steps, []
    gone = ", ".join(str(s) for s in steps if s in empty)
    what = ("no backward or optimizer op (the code after the loop's last profiler.step(), before stop(): an "
            "epoch's end?)" if any(t.meta.cut_step.idle for t in ranks) else "none of the training loop's ops")
    return kept, [f"step {gone} left out on all ranks: it holds {what} on {len(ranks)} of "
                  f"{len(run.ranks)} rank(s) (the loop's last profiler.step() opened it and stop() closed it)"]


def refuse_cut_steps(run: Run, steps: list[int]) -> list[str]:
    """One line instead of an answer that counts a step the trace's end cut inside (``RankMeta.cut_step``) as a whole one:
    half a step read as a shorter one (a one-step trace cut half-way answered 47.8 ms for a 95.7 ms step; a public MI250
    trace's empty last step, 49 us, made 9.3 ms steps an iteration of 4.69; a default window leaves such a step out,
    ``leave_out_empty_last``). A step whose loop ops are only the first ones of the steps before it, or none of them
    the op every step before ends on, is said, not refused: a gradient-accumulation step under ``no_sync`` after a
    synchronising one is such a start too (``tests/data/cut-steps``); the lines returned say it, with the window that
    leaves it out."""
    said = []
    for t in run.ranks:
        cut = t.meta.cut_step
        if cut is None or cut.step + t.meta.step_offset not in steps:
            continue
        others = [s for s in steps if s != cut.step + t.meta.step_offset]
        fix = f"--steps {others[0]}:{others[-1] + 1} leaves it out" if others else "profile whole steps"
        if cut.ended:
            said.append(f"{os.path.basename(t.source)}: step {cut.step}'s {cut.ops} ops on the training loop's thread hold no "
                        f"{cut.ended}, the op that step {cut.like}'s {cut.of} (and every step before) end on, nothing in the "
                        "trace after them: the profiler stopped inside the step, or a step of the loop's own that ends "
                        f"otherwise (gradient accumulation's no_sync? a skipped optimizer step?); the iteration counts it as "
                        f"a step; {fix}")
            continue
        if cut.like >= 0 and cut.ops:
            said.append(f"{os.path.basename(t.source)}: step {cut.step}'s {cut.ops} ops on the training loop's thread are only "
                        f"the first {cut.ops} of step {cut.like}'s {cut.of} (and of every step before), in the same order, "
                        "nothing in the trace after them: the profiler stopped inside the step, or a shorter step of the "
                        f"loop's own (gradient accumulation's no_sync?); the iteration counts it as a step; {fix}")
            continue
        if cut.idle:
            told = "it holds no backward or optimizer op, where every step before it does"
        elif cut.like < 0:
            told = f"{cut.ops} of its ops end where its step marker ends, and nothing in the trace after them"
        else:
            told = f"it holds none of the {cut.of} ops step {cut.like} ran on the training loop's thread"
        raise DagprofError(f"ends inside step {cut.step}: {told} (the file was cut, or the profiler stopped, inside the "
                           f"step); {fix}", t.source)
    return said
