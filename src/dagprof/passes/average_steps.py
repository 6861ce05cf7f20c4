"""Replace each op's duration and overhead by its mean over the profiled steps.

Replaying the measured timeline op for op reproduces it by construction; a model of *the*
iteration (what every what-if starts from) must instead predict the measured mean from one
per-op figure each, as dPRO does. Ops are matched across steps by (rank, lane, name, how many
ops of that name came before it on the lane in its step; a name found in one step only, a collective's instance, less
its suffix: ``_base_names``): an op one step has and another lacks (an extra copy, a data-loader call) then shifts
nothing else. An op that has no twin in other steps keeps its own values. The threads of a pool (``pooled_lanes``: XLA's
Eigen threads, TF's inter-op threads, which run a loop's iterations on whichever is free) are one lane there, their ops
counted in start order: matched per thread, the k-th call on a thread paired with another iteration in the next step
(``tf-jax/lstm-lm-jit`` +30.1 -> +2.4 %; +1.4 % with the scan body's ops told apart by their full names and every pool
task's scheduler resolved). A pool op's time beyond the median of its twins (a thread descheduled for a scheduler tick)
stays in its step (``pool_delays``): spread over every step it landed where another split of the pool's work queued
more behind it (``tf/seq2seq-fp16`` +6.2 -> +1.2 %, ``tf/widedeep`` +6.4 -> +2.1 %; the other TF fixtures moved within
-1.6..+2.8 %, each inside its measured mean's own standard error of 3-23 %). An XLA compile inside the window (a program
compiled again in every step) stays in its step, out of the means (``compile_gaps``).

Background threads (a watchdog's or poller's ``cudaEventQuery`` loop, a loader thread) are host
threads whose ops no op of another lane depends on: only the closing step mark follows them. They are
replayed as measured, op for op, and do not define the iteration: the closing mark no longer
waits for them. Their op counts differ from step to step, so their times have no twins to
average, and an averaged polling chain would end wherever its summed mean gaps fall, long after
the step it polled in.

A join of ranks (a collective's ``SYNC``) waits in every step for the rank that arrived last. Averaged,
it waits only as long as the averaged arrivals make it, which falls short where ranks take turns
arriving last: a mean of maxima exceeds the maximum of means. With a replayer, each join keeps the
wait it cost on average: how far the last arrival lagged the ranks' mean arrival, averaged over the
measured steps, less the same lag in a replay of the averaged steps, becomes the averaged join's gap.
That lag is measured from the ranks' own mean arrival, so a delay common to all ranks (an earlier
join's added wait) cancels; where one rank is always last, or with one rank, nothing is added.
A sub-group's join (HSDP's shard all-gathers and reduce-scatters, its replica all-reduces) delays only
its ranks, so its added wait reaches the next join of another group as a lag the measurement holds
too: there the waits are settled by replaying with them until each group's replayed lag is its measured
one (at most 8 replays; the slowest of the kept runs below settles in 19, 0.04 % away). On 9 kept
4-rank HSDP runs on 2 cores (5 steps) the averaged replay moved from -0.9..-17.3 % to -0.2..+1.6 %, and on the
2-step ``hsdp-conv`` fixture from -5.5 to -1.1 %; on the 2-step ``hsdp`` fixture from -1.65 to +5.0 % (below).
A join that some steps lack (a Horovod negotiation's: its cycles fall differently each step, 2 to 16 a step, and a join
is named by its cycle's first tensor) has its measured lag read in every step all the same, at its predecessors' twins
there: averaged over the few steps that had a join of its name, a wait measured at one step's critical join landed on
another step's, and the convex maximum overshot (a fresh ``hvd_transformer`` run +4.77 -> -1.13 %; 40 kept runs of two
Horovod scripts 36 -> 38 within 3 %). A join every step has is read on its own, as before.

The window's edges are not steps. Its closing marks lie outside it; its opening marks' gaps are the ranks' entry skew,
the replay's origin, and stay as measured too: averaged with the next step's marks they had moved part of the skew into
the window's middle (``hsdp``: rank 1, in 39 ms after rank 3, opened 18 ms early and began its second step 18 ms late).
A rank in before another may also wait for it inside an op the graph does not split (``tp-fresh/ep-dp``: an all-to-all
inside rank 0's first forward, 11.2 ms against 0.9): the first step keeps that excess where it was measured and the
means leave it out (``entry_waits``), instead of spreading it over every step while the kept skew makes the joins wait
for the late rank once more. ``hsdp`` +5.0 -> +2.9 %, ``ep-dp`` +21 % with the marks alone -> +0.1 %. Any first-step
op's time beyond its slowest twin of 2 or more later steps (a one-off cost: ``first_step_excess``) stays there likewise
(not in a parameter server's job, whose workers run slow ops beside the exchange: there the means take it all).

A step whose ranks ran collectives of the job's own (a state_dict gathered by ``DTensor.full_tensor``, a DCP save's object
collectives; FSDP2: ``graph.build_fsdp.job_collective_steps``; a save every k steps) is averaged only with the window's
other such steps: matched with every step, the save's own host time
(the dict built, rank 0's ``torch.save``) sat in the k-th gap of a name all steps have and was spread over all of them
(``bench/fsdp_fresh/prefetch_offload.py --save-every 2``, rank 1: 7-8 ms of each save step's pre-forward gap on every
step). A window with one such step keeps it as measured.

A mean of 2 steps cannot tell a one-off cost from the job's steady behaviour (``hsdp``: rank 3 took its steps 189 and
127 ms, rank 1 its optimizer step 8 and 52 ms; seven other ways of averaging tried, none nearer overall). Where a
rank's two steps differ by 2 % or more (or the first step's waits for late ranks are worth 1 % of an iteration), a
warning says so with the figures (docs/evidence.md: fresh HSDP jobs' 2-step windows
spread -6.2..+12.2 %, their 5-step ones, the default, -0.8..+6.5 %).

A parameter server's sums are such joins too, but mx.profiler does not time single pushes: there each worker's exchange
keeps the per-step replay's mean wait instead (``exchange_waits``). A row_sparse pull is a wait the other way: an op
MXNet's engine ran early, while a table's forward waited for its rows, spent its gap beside the pull; that gap stays in
its step and out of the mean (``row_wait_gaps``).

The same alternation hides a collective's exit lag (``passes.comm``: the later ranks leave it a wire time after the
first): each rank's averaged consumer gap holds its share of the last rank's lag, the ranks' shares come out alike,
and the lag per rank that a link what-if scales is about 0. So where the last rank out changes from step to step,
the averaged collective carries its last rank's lag, averaged over the measured steps (``Graph.exit_lag``), for
``passes.comm.retime_collectives`` to scale on every rank, and each of its consumers its own rank's share (what a
faster link can take off that rank). The replay does not read them: the averaged iteration, and a what-if at the
profiled link, are what they were (the join's added wait keeps its part of the lag there).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..graph.build_fsdp import job_collective_steps
from ..graph.build_ps import DONE, ISSUE, KEY_IN, PULLED, is_ps_graph, rebuild_ps
from ..graph.dag import DeviceKind, Graph
from ..graph.provenance import provenance
from ..graph.replay_result import ReplayResult
from ..intervals import overlaps
from ..traces.events import Kind
from .comm import current_scheme, current_topology, exit_lags, wire_lags
from .link_fit import priced_comm
from .run_kinds import Replayer

_SUBGROUP_ROUNDS = 8  # replays at most to settle sub-group joins' waits (join_waits)
_SETTLED_US = 1.0  # a change of wait below this ends them
_SWING = 2.0  # a step this many times its rank's median step (or its inverse) is one the averaged replay does not stand for
_POOLS = ("XLAEigen", "tf_Compute")  # in the names XPlane gives XLA's CPU intra-op and TF's inter-op threads (pooled_lanes)


def average_steps(g: Graph, replayer: Replayer | None = None) -> Graph:
    """Each op at its mean over the steps, and each collective whose last rank out alternates with that rank's
    mean exit lag (its consumers with their own ranks'); with ``replayer`` (``dagprof.replay.replay``), each
    join of ranks also keeps its mean wait for the last rank, and the first step its waits for ranks that entered the
    window later (module docstring)."""
    if len(g) == 0:
        return g
    compiled = compile_gaps(g)
    if not compiled.any():
        return _averaged(g, replayer)
    out = _averaged(g.replace(gap=g.gap - compiled), replayer)  # the means without the compiles, each kept in its step
    return out.replace(gap=out.gap + compiled)


def compile_gaps(g: Graph) -> np.ndarray:
    """Per node: the time XLA compiled during its gap, on its rank (``GraphMeta.xla_compiles``; 0 elsewhere).

    Keras' ``compile(jit_compile=True)`` compiled the step's program again in every step (``tf/tft-jit``: 7.3 / 8.6 / 8.0 /
    2.4 s of its four steps), and each XLA worker thread's first op after it carries the compile in its gap. Those ops are
    a pool's: the pool-delay rule (``pool_delays``) kept the longer steps' excess over the median where it was and raised
    the shorter to the median (``copy.197``'s gap in step 9 3.4 -> 7.1 s, that step replayed in 8.5 s where 4.6 were
    measured): the averaged replay +8.79 % (a plain mean, +16.6 %). A compile is a one-off cost of its step, as measured:
    it stays there and the means take the rest (-0.02 %)."""
    out = np.zeros(len(g))
    p = provenance(g)
    if not g.meta.xla_compiles or p is None:
        return out
    for r, spans in g.meta.xla_compiles.items():
        at = np.flatnonzero((g.rank == r) & np.isfinite(p.mstart) & (g.gap > 0))
        out[at] = overlaps(np.asarray(spans, dtype=np.float64).reshape(-1, 2), p.mstart[at] - g.gap[at], p.mstart[at])
    return out


def _averaged(g: Graph, replayer: Replayer | None) -> Graph:
    """``average_steps`` once compiles are out of the gaps."""
    n = len(g)
    g = _one_exchange_rate(g)
    background = background_lanes(g)
    lane = g.device.astype(np.int64)
    names = _base_names(g)
    pool = pooled_lanes(g, background)
    pooled = (lane >= 0) & (np.bincount(pool, minlength=len(pool))[pool] > 1)[np.maximum(lane, 0)]
    saving = np.isin(g.step, job_collective_steps(g)).astype(np.int64)  # steps that save: twins of each other only
    key = np.stack([g.rank.astype(np.int64), np.where(lane >= 0, pool[np.maximum(lane, 0)], lane), g.step.astype(np.int64),
                    names, saving], axis=1)
    began = np.where(pooled, g.order, 0.0)  # a pool's occurrences counted in start order over its threads
    order = np.lexsort((np.arange(n), began, key[:, 3], key[:, 2], key[:, 1], key[:, 0]))  # (saving is constant in a step)
    first = np.ones(n, dtype=bool)
    first[1:] = np.any(key[order][1:] != key[order][:-1], axis=1)
    starts = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    occurrence = np.empty(n, dtype=np.int64)
    occurrence[order] = np.arange(n) - starts
    match = np.stack([key[:, 0], key[:, 1], key[:, 4], key[:, 3], occurrence], axis=1)
    _, inverse = np.unique(match, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    keep = ~np.isin(g.step, g.meta.steps) | np.isin(lane, background)  # outside the window (its closing mark), background lanes
    keep |= (g.kind == Kind.STEP) & np.isin(g.step, g.meta.steps[:1])  # opening marks: their gaps are the ranks' entry skew
    counts = np.maximum(np.bincount(inverse, weights=~keep), 1)
    entry = entry_waits(g, inverse, ~keep, replayer(g)) if replayer is not None else np.zeros(n)
    lag = carried_exit_lags(g, inverse, ~keep)
    one_off = np.zeros(n) if is_ps_graph(g) else first_step_excess(g, inverse, ~keep)  # (``first_step_excess``: not a PS job's)
    excess = np.maximum(one_off, np.where(pooled, pool_delays(inverse, ~keep, g.dur + g.gap), 0.0))
    entry = np.maximum(entry, np.where(lag[inverse] > 0, 0.0, excess))  # lags: a link what-if's
    own_dur = np.maximum(g.dur - entry, 0.0)  # the wait taken from the op's duration first, then from its gap
    own_gap = np.maximum(g.gap - np.maximum(entry - g.dur, 0.0) - np.maximum(row_wait_gaps(g, inverse, ~keep), key_wait_gaps(g, inverse, ~keep)),
                         0.0)
    dur = np.bincount(inverse, weights=np.where(keep, 0.0, own_dur)) / counts
    gap = np.bincount(inverse, weights=np.where(keep, 0.0, own_gap)) / counts
    dur, gap = dur[inverse] + g.dur - own_dur, gap[inverse] + g.gap - own_gap  # the first step keeps its waits where they were
    out = _release_closing_marks(g.replace(dur=np.where(keep, g.dur, dur), gap=np.where(keep, g.gap, gap),
                                           exit_lag=np.where(keep, g.exit_lag, lag[inverse]),
                                           ready_spread=g.ready_spread.where(keep)), background)  # one step's spread: not the mean's
    for note in (_too_few_steps(g, entry), swinging_steps(g)):
        if note:
            out.meta.warnings.append(note)
    if replayer is None:
        return out
    wait = np.where(keep, 0.0, join_waits(g, out, inverse, ~keep, replayer)[inverse])
    if is_ps_graph(g):
        wait += exchange_waits(g, out, ~keep, replayer)
    return out if not wait.any() else out.replace(gap=out.gap + wait)


def _one_exchange_rate(g: Graph) -> Graph:
    """A parameter server's job with its exchanges rebuilt at the one rate fitted to their mean (``PsLinkFit.step_factors``
    dropped): each step's own rate keeps each step's exchange in a replay of the steps, where the means of the averaged
    steps need the mean one (as op times are averaged): the steps' own rates, averaged, overshoot where one step's
    exchange ran several times the others' (``mx_gru_forecast.py`` under load)."""
    fit = g.meta.ps_link_fit
    if fit is None or not fit.step_factors:
        return g
    out = rebuild_ps(g, current_scheme(g).servers, current_topology(g).inter, step_factors={})
    out.meta.ps_link_fit = replace(fit, step_factors=())
    return out


def entry_waits(g: Graph, group: np.ndarray, mine: np.ndarray, measured: ReplayResult) -> np.ndarray:
    """Per node: the time its window's first step spent waiting for a rank that entered the window later (0 elsewhere).

    Ranks enter the profiled window apart (the opening marks keep that skew), and a rank in before another may wait
    for it inside an op (a blocking call the graph does not split, as the expert all-to-all inside ``tp-fresh/ep-dp``'s
    forward): the op takes longer in the first step than in the others. Per op of the first step on a rank that a later
    rank entered during: what its time (gap and duration) exceeds its twins' mean over the later steps by, up to how
    long it ran from its start (or its rank's entry) to that entry, read from ``measured`` (the replay of ``g``, which
    reproduces the measured timeline on one clock). The means leave it out and the first step keeps it.
    """
    out = np.zeros(len(g))
    opening = np.flatnonzero((g.kind == Kind.STEP) & np.isin(g.step, g.meta.steps[:1]) & (g.rank >= 0))
    if len(opening) < 2:
        return out
    entry = np.full(int(g.rank.max()) + 2, np.nan)  # index -1: no rank
    entry[g.rank[opening]] = measured.start[opening]
    later = mine & (g.step != g.step[opening[0]])
    twins = np.bincount(group, weights=later, minlength=int(group.max()) + 1)
    mean = np.bincount(group, weights=np.where(later, g.dur + g.gap, 0.0), minlength=len(twins)) / np.maximum(twins, 1)
    first = np.flatnonzero(mine & (g.step == g.step[opening[0]]) & (g.rank >= 0) & (twins[group] > 0))
    since = np.maximum(measured.start[first] - g.gap[first], entry[g.rank[first]])
    entries = np.sort(measured.start[opening])
    spanned = entries[np.maximum(np.searchsorted(entries, measured.end[first], side="right") - 1, 0)]  # the last entry by its end
    waited = np.where(spanned > since, spanned - since, 0.0)  # from its start (or its rank's entry) to a later rank's entry
    excess = g.dur[first] + g.gap[first] - mean[group[first]]
    out[first] = np.clip(np.minimum(excess, waited), 0.0, None)
    return out


def first_step_excess(g: Graph, group: np.ndarray, mine: np.ndarray) -> np.ndarray:
    """Per node of the window's first step: how far its time (gap and duration) exceeds its slowest twin's in the later
    steps, where it has 2 twins or more (0 elsewhere).

    A one-off cost of the window's first step (a first batch loaded, a buffer allocated) lies on that step's critical
    path, where the other ranks wait for it; averaged over the steps it lands in each step's slack instead and the
    replay misses it (``hvd_sparse_gru``: rank 1's first pre-forward 133 ms, its 9 twins 6.4 ms on average). Only what
    exceeds every later step's time is kept where it was measured; the means take the rest. Priced transfers, and the
    ops that carry a collective's exit lag, stay averaged: a link what-if rescales them, which a kept excess would not follow.

    Not in a parameter server's job (``average_steps`` leaves it out there): its workers push every gradient when
    ``trainer.step`` is called and run what no push waits for (an unrolled GRU cell's input gradient, ``SliceChannel``
    and its gates) beside the exchange, where a slow op is hidden. On a loaded host each step has such slow ops, a
    different one each; kept where it fell in the first step, beside the first step's share of every later step's, the
    averaged first step ran its backward 54 ms past its exchange where 14 were measured (``mx_gru_forecast.py``, 5 runs
    beside 4 CPU burners: the averaged replay +1.5 to +3.7 %, without it +0.0 to +1.0 %; docs/evidence.md).
    """
    out = np.zeros(len(g))
    opening = g.step == g.meta.steps[0] if len(g.meta.steps) else np.zeros(len(g), dtype=bool)
    later = mine & ~opening
    twins = np.bincount(group, weights=later, minlength=int(group.max()) + 1)
    slowest = np.full(len(twins), -np.inf)
    np.maximum.at(slowest, group[later], (g.dur + g.gap)[later])
    first = np.flatnonzero(mine & opening & (twins[group] >= 2) & ~priced_comm(g))  # a transfer's time is its link's
    out[first] = np.maximum(g.dur[first] + g.gap[first] - slowest[group[first]], 0.0)
    return out


def row_wait_gaps(g: Graph, group: np.ndarray, mine: np.ndarray) -> np.ndarray:
    """Per node in ``mine``: its gap where the engine ran it early, beside a row_sparse pull, while the op that waits for
    the rows (the table's forward op) waited on the same lane (0 elsewhere).

    MXNet's engine runs an op once what it reads is ready, not in the order the front end issued them: while a
    ``SparseEmbedding``'s forward waits for its rows, an op issued later that reads nothing pulled (the backward's head
    gradient, ``SetValueOp``) runs first, when the front end gets to it, after its own Python time. The lane's chain is the
    measured order, so that time is the gap between the op and the one before it, spent beside the pull. Such an op
    runs after the consumer in another step of the window (where the rows came early, in the order they were issued),
    which is how it is told: its gap stays in its step, where the pull hid it, and the means take the twins' gaps
    without it; averaged into every step it lay on the path of the steps whose rows came early
    (``mx_sparse_mf.py``: ``SetValueOp`` 3.9-5.2 ms before the second table's forward in 3 of 6 worker steps, 0.0-0.1 ms
    after the forward in the others; the averaged replay +3.4 %)."""
    out = np.zeros(len(g))
    if PULLED not in g.names:
        return out
    consumers = np.unique(_fed_by(g, PULLED))
    consumers = consumers[mine[consumers] & (g.device[consumers] >= 0)]
    twin_of = {(int(group[v]), int(g.step[v])): int(v) for v in np.flatnonzero(mine)}  # (group, step) -> its node there
    for c in consumers.tolist():
        step, lane = int(g.step[c]), int(g.device[c])
        before = np.flatnonzero(mine & (g.device == lane) & (g.step == step) & (g.order < g.order[c]) & (g.kind != Kind.STEP))
        for s in g.meta.steps:
            other = twin_of.get((int(group[c]), int(s)))
            if s == step or other is None:
                continue
            for x in before.tolist():
                twin = twin_of.get((int(group[x]), int(s)))
                if twin is not None and g.order[twin] > g.order[other]:  # issued after the consumer: ran early here
                    out[x] = g.gap[x]
    return out


def key_wait_gaps(g: Graph, group: np.ndarray, mine: np.ndarray) -> np.ndarray:
    """Per node in ``mine``: its gap where its twins ran on the other side of the exchange's last pull in some step (one
    waits for a single key's pull, ``graph.build_ps.KEY_IN``, another for the last, or for none); 0 elsewhere.

    A pulled key's copy runs beside the other pulls in one step and after the last in another; its gap then holds
    different waits: the thread's time since its key came in, or since the last one did (a thread descheduled after
    the exchange: the user MLP fixture's first copy 55 ms after the last pull in one step of 3, beside the pulls in the
    others). Averaged, that stall went beside the pulls in two steps, where it hid (the averaged replay +0.3 -> -3.9 %);
    kept in its step it counts where it was measured."""
    out = np.zeros(len(g))
    if KEY_IN not in g.names:
        return out
    floating = np.zeros(len(g), dtype=bool)
    floating[_fed_by(g, KEY_IN)] = True
    size = np.bincount(group[mine], minlength=int(group.max()) + 1)
    hit = np.bincount(group[mine & floating], minlength=len(size))
    mixed = (hit > 0) & (hit < size)
    at = mine & mixed[group]
    out[at] = g.gap[at]
    return out


def _fed_by(g: Graph, name: str) -> np.ndarray:
    """The nodes an edge from a node called ``name`` (one of ``g.names``) leads to, once per edge."""
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    return g.succ[g.name[src] == g.names.index(name)].astype(np.int64)


def pool_delays(group: np.ndarray, mine: np.ndarray, time: np.ndarray) -> np.ndarray:
    """Per node in ``mine``: how far its ``time`` exceeds the median of its twins' in the other steps, where it has 2 twins
    or more (0 elsewhere).

    A pool thread descheduled mid-op (about 4 ms, a scheduler tick, on loaded cores) delays that op in one step, while the
    pool's other thread goes on with the work that step's assignment gave it. Averaged, the delay lands on the same op in
    every step, where another split of the pool's work over its threads queues more behind it (``tf/seq2seq-fp16``: a
    GRU loop body's call 4 ms in 3 steps of 4, at another position each time, on either thread). Kept in its step,
    where the measured split absorbed it, the delay still counts towards the mean; the means take the typical time.
    """
    out = np.zeros(len(group))
    at = np.flatnonzero(mine)
    at = at[np.lexsort((time[at], group[at]))]  # each group's members, fastest first
    g = group[at]
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    size = np.diff(np.r_[first, len(at)])
    k = np.repeat(size, size)  # the member's group size
    i = np.arange(len(at)) - np.repeat(first, size)  # its place in the group
    base = np.repeat(first, size)

    def other(j: np.ndarray) -> np.ndarray:  # the j-th fastest of the member's twins (the group less the member)
        return time[at[base + j + (j >= i)]]

    mid = (size - 1 >= 2)[np.repeat(np.arange(len(first)), size)]  # members with 2 twins or more
    m, i, base = k[mid] - 1, i[mid], base[mid]
    median = np.where(m % 2 == 1, other(m // 2), (other(m // 2 - 1) + other(m // 2)) / 2)
    out[at[mid]] = np.maximum(time[at[mid]] - median, 0.0)
    return out


def _too_few_steps(g: Graph, entry: np.ndarray) -> str | None:
    """The one-line warning for a mean of 2 steps that cannot be trusted to 1 %: where a rank's two measured steps differ by
    2 % of their mean or more (the mean is then 1 % or more from either, and which of them is the job's one step cannot
    tell: module docstring), or where the first step's waits for late ranks (``entry_waits``) are worth 1 % of an
    iteration or more."""
    if len(g.meta.steps) != 2:
        return None
    spread = _step_spread(g)
    per_rank = np.bincount(np.maximum(g.rank, 0), weights=np.where(g.rank >= 0, entry, 0.0))
    waits = entry.any() and per_rank.max() / 2 >= 0.01 * max(g.meta.measured_iter_us.values(), default=0.0)
    apart = spread is not None and spread.apart >= 0.02
    if not (apart or waits):
        return None
    parts = []
    if apart:
        parts.append(f"rank {spread.rank}'s two steps took {spread.first_us / 1e3:.1f} and {spread.second_us / 1e3:.1f} ms "
                     f"({100 * spread.apart:.0f} % apart)")
    if waits:
        k = int((entry > 0).sum())
        parts.append(f"{k} first-step op{'s' if k > 1 else ''} took {entry.sum() / 1e3:.1f} ms more than in the second until a "
                     f"later rank entered the window, kept in the first step as waits for it, not averaged")
    return (f"averaged replay of 2 steps: {'; '.join(parts)}; one step cannot tell a one-off cost from step-to-step "
            f"variation: profile 5 steps or more (dagprof profile's default --steps 5:10)")


def swinging_steps(g: Graph) -> str | None:
    """The one-line warning for a window whose steps swing so far that its averaged replay is no one step's: where a rank
    of 3 measured steps or more took some at least ``_SWING`` times its median step, or at most its inverse (the rank with
    the most such steps named).

    One averaged figure per op predicts the steps' mean (what ``measured`` is), and a step 2x the median is a share of
    every op in it. Where the load stretched some steps (a Horovod GINE's window: 98 to 825 ms, median 196) or the batches'
    sizes differ, the mean belongs to no step, and the ranks' turns at being late, averaged into every join, are priced
    by means of waits that in the steps overlapped: its averaged replays missed by -4.1 to +18.2 % in 6 of 17 such
    windows (docs/evidence.md, ``swing62``)."""
    p = provenance(g)
    if p is None or len(g.meta.steps) < 3:
        return None
    worst = None
    for r in g.ranks():
        times = _step_times(g, p.mstart, int(r))
        times = times[np.isfinite(times)]
        if len(times) < 3 or np.median(times) <= 0:
            continue
        mid = float(np.median(times))
        far = int(((times >= _SWING * mid) | (times <= mid / _SWING)).sum())
        if far and (worst is None or far > worst[0]):
            worst = (far, len(times), int(r), float(times.min()), float(times.max()), mid, float(times.mean()))
    if worst is None:
        return None
    far, n, r, lo, hi, mid, mean = worst
    return (f"averaged replay: {far} of rank {r}'s {n} steps took {_SWING:g}x its median step or more, or half of it or less "
            f"({lo / 1e3:.1f} to {hi / 1e3:.1f} ms, median {mid / 1e3:.1f}, mean {mean / 1e3:.1f}): the averaged replay predicts "
            f"the steps' mean, not any one step, and where the load swung them it can miss that mean by more than 3 %; "
            f"profile a quieter window or compare per-step replays (dagprof replay without --template)")


@dataclass(frozen=True)
class _StepSpread:
    """The rank whose two measured steps differ most: what the 2-step warning names (``_too_few_steps``)."""

    apart: float  # how far apart its two steps are, relative to their mean
    rank: int
    first_us: float
    second_us: float


def _step_spread(g: Graph) -> _StepSpread | None:
    """The rank whose two measured steps differ most, start to start as ``traces.steps.iteration_us`` times them, from
    the step marks' measured starts (each rank's own clock); None without provenance."""
    p = provenance(g)
    if p is None:
        return None
    best = None
    for r in g.ranks():
        times = _step_times(g, p.mstart, int(r))[:2]
        if len(times) == 2 and np.all(np.isfinite(times)) and times.sum() > 0:
            apart = float(abs(times[0] - times[1]) / times.mean())
            if best is None or apart > best.apart:
                best = _StepSpread(apart, int(r), float(times[0]), float(times[1]))
    return best


def _step_times(g: Graph, mstart: np.ndarray, rank: int) -> np.ndarray:
    """``rank``'s window steps, start to start as ``traces.steps.iteration_us`` times them, from its step marks' measured
    starts (``mstart``: the provenance's, each rank's own clock)."""
    marks = np.flatnonzero((g.kind == Kind.STEP) & (g.rank == rank))
    return np.diff(mstart[marks[np.argsort(g.step[marks])]])[:len(g.meta.steps)]


def carried_exit_lags(g: Graph, group: np.ndarray, mine: np.ndarray) -> np.ndarray:
    """Per group of matched nodes, the exit lag the averaged model carries (0 for other groups): for a collective whose
    last rank out changes from step to step, the wire time in its last rank's lag (``passes.comm.wire_lags``), and for
    each of its consumers the wire time in its own rank's, each averaged over the measured steps."""
    out = np.zeros(int(group.max()) + 1)
    pairs, lag = exit_lags(g, np.flatnonzero(priced_comm(g) & mine))
    if not (lag > 0).any():
        return out
    wire = wire_lags(g, pairs[:, 0], lag)
    colls, of = np.unique(pairs[:, 0], return_inverse=True)
    most, top, last = np.zeros(len(colls)), np.zeros(len(colls)), np.full(len(colls), -1)
    np.maximum.at(most, of, wire)
    np.maximum.at(top, of, lag)
    np.maximum.at(last, of, np.where((lag == top[of]) & (lag > 0), g.rank[pairs[:, 1]], -1))  # the rank that left last
    groups, by = np.unique(group[colls], return_inverse=True)
    by = by.ravel()
    lo, hi = np.full(len(groups), np.iinfo(np.int64).max), np.full(len(groups), -1)
    np.minimum.at(lo, by[last >= 0], last[last >= 0])
    np.maximum.at(hi, by, last)
    alternate = (hi >= 0) & (lo < hi)
    out[groups[alternate]] = (np.bincount(by, weights=most) / np.bincount(by))[alternate]
    on = alternate[by[of]]  # the pairs of those collectives
    consumers, at = np.unique(group[pairs[on, 1]], return_inverse=True)
    out[consumers] = np.bincount(at.ravel(), weights=wire[on]) / np.bincount(at.ravel())
    return out


def join_waits(g: Graph, averaged: Graph, group: np.ndarray, mine: np.ndarray, replayer: Replayer) -> np.ndarray:
    """Per group of matched nodes: the wait its joins of ranks lack once averaged (0 for other groups).

    A rank arrives at a join when the last of its predecessors of the join ends. Per join, the lag
    of the last arrival behind the ranks' mean arrival; per group, its mean over the measured steps
    (``g``'s provenance, on the shared clock) less its mean in a replay of ``averaged``. Only groups
    whose joins all see the same ranks arrive, and whose last rank is not always the same one, can
    lack a wait (the replay is skipped otherwise); a graph without provenance gets none.

    A sub-group's join (HSDP's shard and replica collectives) delays only its ranks, so its added
    wait shows up at the next join of another group as a lag the measurement holds too: there the
    waits are found by replaying ``averaged`` with them until each group's replayed lag is its measured one
    (a join's own wait does not move its lag, only later ones, so each round settles one more join of a chain).
    """
    out = np.zeros(int(group.max()) + 1)
    p = provenance(g)
    if p is None or not p.clock_us:
        return out
    clock = np.array([p.clock_us.get(r, np.nan) for r in range(int(g.rank.max()) + 1)] + [np.nan])  # index -1: no rank
    measured = _join_lags(g, group, mine, p.mend + clock[g.rank], twins=True)
    if measured is None:
        return out
    groups, lag, alternate, whole = measured
    if not alternate.any():
        return out
    rounds = 1 if whole[alternate].all() else _SUBGROUP_ROUNDS  # a join of every rank delays all alike: one round settles it
    for _ in range(rounds):
        wait = out[group]
        replayed = _join_lags(g, group, mine, replayer(averaged.replace(gap=averaged.gap + np.where(mine, wait, 0.0))).end)
        if replayed is None:
            return out
        lag_avg = dict(zip(replayed[0].tolist(), replayed[1].tolist()))
        new = out.copy()
        for k, x, alt in zip(groups.tolist(), lag.tolist(), alternate.tolist()):
            if alt and k in lag_avg:
                new[k] = max(x - lag_avg[k], 0.0)
        if np.abs(new - out).max() < _SETTLED_US:
            return new
        out = new
    return out


def exchange_waits(g: Graph, averaged: Graph, mine: np.ndarray, replayer: Replayer) -> np.ndarray:
    """Per node: the wait a parameter-server job's averaged exchange lacks, on each worker's ``ps done`` (0 elsewhere).

    A server sums a key once every worker's push is in, so the slowest worker of the step gates everyone's pull: where the
    workers take turns being slowest (a loaded machine), averaging each worker's backward and issue times separately
    loses that wait, as at a collective's join (module docstring). On the user MLP fixture (1 server, 2 workers whose
    steps swung from 94 to 178 ms) the averaged replay fell 13.5 % short. Staggered arrivals also cost the ports less than
    simultaneous ones (the early worker's pushes are in before the late one's leave), so the lost wait is measured on
    the whole exchange: per worker and step, from the workers' mean last issue to the worker's done. mx.profiler does not
    say which push carries which key, so these times are the per-step replay's (each step with its own op times: the
    model of that step, which reproduces the profiled iteration). Each worker's done keeps the mean over the steps less
    the averaged replay's, where that is positive. It goes on the done, which what-ifs keep (they re-place and re-price
    the pushes, sums and pulls between issue and done: ``graph.build_ps.rebuild_ps``).
    """
    out = np.zeros(len(g))
    issue = mine & (g.name == g.names.index(ISSUE)) if ISSUE in g.names else np.zeros(len(g), dtype=bool)
    done = np.flatnonzero(mine & (g.name == g.names.index(DONE))) if DONE in g.names else np.zeros(0, dtype=np.int64)
    if not len(done) or not issue.any():
        return out

    def lag(end: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Per done: its start less the workers' mean last issue in its step."""
        steps, of = np.unique(g.step[issue], return_inverse=True)
        pairs, at = np.unique(np.stack([of.ravel(), g.rank[issue]], axis=1), axis=0, return_inverse=True)
        last = np.full(len(pairs), -np.inf)
        np.maximum.at(last, at.ravel(), end[issue])
        ref = np.bincount(pairs[:, 0], weights=last, minlength=len(steps)) / np.bincount(pairs[:, 0], minlength=len(steps))
        return start[done] - ref[np.searchsorted(steps, g.step[done])]

    per_step, avg = replayer(g), replayer(averaged)
    _, by = np.unique(g.rank[done], return_inverse=True)
    lost = (np.bincount(by.ravel(), weights=lag(per_step.end, per_step.start)) -
            np.bincount(by.ravel(), weights=lag(avg.end, avg.start))) / np.bincount(by.ravel())
    out[done] = np.maximum(lost, 0.0)[by.ravel()]
    return out


def _join_lags(g: Graph, group: np.ndarray, mine: np.ndarray, end: np.ndarray,
               twins: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(groups, their mean lag of the last arrival behind the mean arrival, whether the last rank alternates, whether
    every rank joins) over the joins of ranks in ``mine``, arrivals read from ``end`` (per node); None when there are none.

    With ``twins``, a group of joins that some step of the window lacks (a Horovod negotiation's: the cycles fall
    differently each step) is read in every step, each join from its predecessors' twins there (a step that lacks one of
    them gives no sample): its mean is then of every step's maxima at the join's arrivals, not of the few steps that have
    a join of its name, whose waits, landing on another step's critical join, overshot (module docstring). A group every
    step has is read on its own joins, as without."""
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    dst = g.succ.astype(np.int64)
    rank = g.rank.astype(np.int64)
    e = np.flatnonzero((g.kind[dst] == Kind.SYNC) & mine[dst] & (rank[src] >= 0))
    sample, at_src = dst[e], src[e]  # a sample: a join's arrivals in one step (here its own)
    joins_of = sample
    steps = np.asarray(g.meta.steps, dtype=np.int64)
    if twins and len(steps) > 1:
        table = np.full((int(group.max()) + 1, len(steps)), -1, dtype=np.int64)  # group -> its node in each window step
        own = np.flatnonzero(mine & np.isin(g.step, steps))
        table[group[own], np.searchsorted(steps, g.step[own])] = own
        partial = (table[group[dst[e]]] < 0).any(axis=1)  # edges into joins of a group some step lacks
        other = partial[:, None] & (np.arange(len(steps)) != np.searchsorted(steps, g.step[dst[e]])[:, None])
        edge, k = np.nonzero(other)
        twin = table[group[src[e[edge]]], k]
        tsample = len(g) + dst[e[edge]] * len(steps) + k  # past every node id: apart from the own samples
        lost = np.unique(tsample[twin < 0])  # a step without one of the join's predecessors
        ok = (twin >= 0) & ~np.isin(tsample, lost)
        sample = np.concatenate([sample, tsample[ok]])
        at_src = np.concatenate([at_src, twin[ok]])
        joins_of = np.concatenate([joins_of, dst[e[edge[ok]]]])
    ok = np.isfinite(end[at_src])
    sample, at_src, joins_of = sample[ok], at_src[ok], joins_of[ok]
    if not len(sample):
        return None
    pairs, at = np.unique(np.stack([sample, rank[at_src]], axis=1), axis=0, return_inverse=True)  # (sample, rank)
    arrive = np.full(len(pairs), -np.inf)
    np.maximum.at(arrive, at.ravel(), end[at_src])
    samples, of_sample = np.unique(pairs[:, 0], return_inverse=True)
    of_sample = of_sample.ravel()
    join = np.zeros(len(samples), dtype=np.int64)
    join[of_sample[at.ravel()]] = joins_of  # each sample's join node
    ranks = np.bincount(of_sample)
    latest = np.full(len(samples), -np.inf)
    np.maximum.at(latest, of_sample, arrive)
    lag = latest - np.bincount(of_sample, weights=arrive) / ranks
    last = np.full(len(samples), -1)
    np.maximum.at(last, of_sample, np.where(arrive == latest[of_sample], pairs[:, 1], -1))  # which rank came last
    groups, of_group = np.unique(group[join], return_inverse=True)
    of_group = of_group.ravel()
    n = np.bincount(of_group)
    mean_lag = np.bincount(of_group, weights=lag) / n

    def spread(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = np.full(len(groups), np.iinfo(np.int64).max), np.full(len(groups), -1)
        np.minimum.at(lo, of_group, x)
        np.maximum.at(hi, of_group, x)
        return lo, hi

    fewest, most = spread(ranks)
    first_last, later_last = spread(last)
    world = len(np.unique(rank[rank >= 0]))
    return groups, mean_lag, (n > 1) & (fewest == most) & (fewest > 1) & (first_last != later_last), fewest == world


def background_lanes(g: Graph) -> np.ndarray:
    """Host threads whose ops no op on another device depends on; step marks aside.

    A thread that holds step marks is a main thread. Any other thread whose only edges out lead
    to step marks (the closing mark follows every lane's last op) runs free of the step: nothing
    the iteration computes waits for it. GPU streams are the step's work even when nothing on the
    host waits for them, and collective channels are shared by ranks: neither is background.
    """
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    dst = g.succ.astype(np.int64)
    nd = len(g.devices)
    dev = g.device.astype(np.int64)
    cross = (dev[src] != dev[dst]) & (dev[src] >= 0)
    feeds = np.bincount(dev[src][cross & (g.kind[dst] != Kind.STEP)], minlength=nd)[:nd]
    marks = np.bincount(dev[(g.kind == Kind.STEP) & (dev >= 0)], minlength=nd)[:nd]
    used = np.bincount(dev[dev >= 0], minlength=nd)[:nd]
    lanes = [d for d, device in enumerate(g.devices)
             if device.kind == DeviceKind.HOST and used[d] and not feeds[d] and not marks[d]]
    return np.asarray(lanes, dtype=np.int64)


def pooled_lanes(g: Graph, background: np.ndarray) -> np.ndarray:
    """Per device: the first lane of its thread pool (itself where it is in none).

    XLA's CPU workers take whichever op is ready, so one op runs on one thread in a step and on another in the next
    (``tf-jax/lstm-lm-jit``: rank 1's 32 calls a step of the scan body's ``ynn_fusion.1`` split 5/27 over its two
    Eigen threads in one step, 22/10 in the other). Matched per thread, a thread's k-th call then pairs with another
    scan iteration, or with none. The trace shows a pool as that: host threads of one rank, main threads (those with
    step marks) and background ones aside, sharing an op (its exact name: TF's ``MatMul`` and ``MatMul_1`` are two ops)
    whose split over them changes from step to step; such a group is a pool where XPlane names a thread of it XLA's
    Eigen pool (the PjRt client thread, which runs ops inline, joins it) or TF's inter-op pool (``tf_Compute``: TF's
    executor hands each ready op to any of its threads; ``tf/seq2seq-fp16``'s GRU loop body split 13/7, 9/11, 10/10, 4/16 over
    them).
    """
    pool = np.arange(len(g.devices))
    nd = len(g.devices)
    lane = g.device.astype(np.int64)
    marks = np.bincount(lane[(g.kind == Kind.STEP) & (lane >= 0)], minlength=nd)[:nd]
    worker = np.array([d.kind == DeviceKind.HOST for d in g.devices], dtype=bool) & (marks == 0)
    worker[background] = False
    at = np.flatnonzero((lane >= 0) & worker[np.maximum(lane, 0)] & np.isin(g.step, g.meta.steps))
    placed = np.unique(np.stack([g.name[at], lane[at]], axis=1), axis=0)  # names are per rank (``rank0.``)
    shared = np.unique(placed[:, 0])[np.bincount(np.unique(placed[:, 0], return_inverse=True)[1].ravel()) > 1]
    at = at[np.isin(g.name[at], shared)]  # ops seen on two threads or more
    if not len(at):
        return pool
    cells, count = np.unique(np.stack([g.name[at], lane[at], g.step[at]], axis=1), axis=0, return_counts=True)
    ops, of_op = np.unique(cells[:, 0], return_inverse=True)
    lanes, steps = np.unique(cells[:, 1]), np.unique(cells[:, 2])
    split = np.zeros((len(ops), len(lanes), len(steps)))
    split[of_op.ravel(), np.searchsorted(lanes, cells[:, 1]), np.searchsorted(steps, cells[:, 2])] = count
    total = split.sum(axis=1, keepdims=True)
    share = np.where(total > 0, split / np.maximum(total, 1), np.nan)  # steps the op did not run in say nothing
    moved = (np.nanmax(share, axis=2) - np.nanmin(share, axis=2)).max(axis=1) > 0  # its split over the threads changed
    for k in np.flatnonzero(moved):
        on = pool[lanes[split[k].sum(axis=1) > 0]]
        pool[np.isin(pool, on)] = on.min()  # each lane's label stays its pool's first lane
    named = np.unique(pool[[i for i, d in enumerate(g.devices) if any(p in d.name for p in _POOLS)]])
    return np.where(np.isin(pool, named), pool, np.arange(nd))


def _release_closing_marks(g: Graph, background: np.ndarray) -> Graph:
    """Drop the edges from background lanes into step marks, so those lanes do not bound a step."""
    if not len(background):
        return g
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    drop = np.isin(g.device[src], background) & (g.kind[g.succ] == Kind.STEP)
    if not drop.any():
        return g
    indptr = np.zeros(len(g) + 1, dtype=np.int64)
    np.cumsum(np.bincount(src[~drop], minlength=len(g)), out=indptr[1:])
    return g.replace(indptr=indptr, succ=g.succ[~drop])


def _base_names(g: Graph) -> np.ndarray:
    """Name ids, so steps share names: a name found in one step only has its instance suffix (".17", "#5": a collective's
    instance, a step's mark) stripped; a name found in several steps is the op's own (XLA's ``ynn_fusion.2`` and
    ``ynn_fusion.3`` are two ops, stripped they had been counted as one and paired with each other across steps)."""
    pairs = np.unique(np.stack([g.name, g.step], axis=1), axis=0)
    recurs = np.bincount(pairs[:, 0], minlength=len(g.names)) > 1
    base: dict[tuple[str, bool], int] = {}
    ids = np.empty(len(g.names), dtype=np.int64)
    for i, name in enumerate(g.names):
        key = (name, True) if recurs[i] else (name.rstrip("0123456789").rstrip(".#"), False)
        ids[i] = base.setdefault(key, len(base))
    return ids[g.name]
