"""How far to trust a predicted iteration time: an interval around it, from the profile's own steps.

The interval is for the MEDIAN STEP OF A RUN of the job as it will run (unprofiled, later): what a run's
median step (the job's measurement: ``--verify``, the benches) should fall in ``level`` of the time, where
the run is as long as the profiled window (``runs`` steps; a longer run's median varies less). Not the spread
of single steps: a single step's 90 % interval held 100 % of quiet rounds' median steps (too wide for them)
and still missed where a run's level moved. Each source of error below is measured on the profile itself,
never tuned to a benchmark's coverage.

Spread between the point (the replayed steps' median) and a run's median (independent, so in quadrature):

- ``steps``: dagprof keeps every profiled step, so replaying a scenario step by step gives one
  iteration time per step: the point's median is a sample of ``n`` of them, the run's median another
  of ``runs``. The bootstrap standard error of the replayed steps' median (``median_spread``) times
  sqrt(1 + n / runs), at Student-t's quantile, is how far the two medians differ on the machine profiled.
- ``link``: where communication is modelled (a link fitted to the profile, or given), every step's
  collectives cost the model's price, which has no spread: the link model's residuals on the
  profiled steps (measured over modelled communication, step by step) put back the fit's own
  uncertainty and the run's median's share of their step-to-step spread, the same statistic as the
  steps' (``median_spread`` of the residuals, relative to their median: one step whose collectives
  stalled 3x moves a run's median no more than any other step), as two more replays with every
  modelled transfer scaled to that interval's low and high ends. Their median's miss of 1 is the
  model's bias on the profiled run, which ``model`` below carries.
- ``operand_stall``: a link what-if of a JAX job on gloo, whose every array a step may stall for a scheduler
  tick at random (``analysis.operand_stall``): which arrays stall moved with the load and the rate, so two runs
  differ by it as two steps do, at ``level``, either way (below, no more than the stall the point holds, where the
  profiled wire tells it).
- ``overlap`` (high end only, added: a bound, not a spread): FSDP -> DDP without a measured slowdown beside
  collectives (``search.whatif``): the step with DDP's all-reduces slowing the compute beside them as much as the
  host's cores allow (``passes.overlap.core_bound_slowdown``), which the point leaves out.
- ``shared_cores`` (both ends, added: bounds): collectives priced by a link timed alone whose transfer is the ranks' own
  CPU work (``search.shared_cores``): above, each collective slowed beside the compute and that compute beside it, as far
  as ``calibrate --overlap``'s ``comm_slowdown`` (``--link-model``) measured or the cores allow
  (``shared_cores_bound_us``); below, where no slowdown beside the profiled link was measured, the profile's compute
  without the slowdown its own collectives may have put on it. Its scatter between repeats (0-3 per unit of overlap)
  kept it out of the point, which on fresh rounds it overshot. ``whatif`` puts it where the profile records every rank
  on one host and the row keeps that host's link (``on_shared_cores``: no ``--bandwidth``, ``--latency``, ``--link-to``,
  ``--topology``, ``--profiled-bandwidth`` or ``--half-duplex``), ``optimize`` on both ends of a DDP search of such a
  profile (``--verify`` holds the measured strategy against that interval), ``bench/testbed/run.py`` on its unshaped cells.

The least either side may be, ``unprofiled_steps``: what is judged is the job's unprofiled steps,
and the profile holds some of them, before and after its window (from step ``WARMUP_STEPS`` on).
The interval their median gives a run as long as they are (``median_spread``: the level the point
stands on) is the job's own spread as it runs unprofiled, across the run and not the window only:
where the window spread less than the steps around it (a neighbour's load came and went), the
replayed steps alone miss that. It is a second estimate of the same spread, not an independent
source, so it bounds the two above from below rather than adding to them; nor is it pooled with the
replayed steps', which carry the scenario (a slower link spreads them) and, in a calm window, would
dilute the spread of the very kind of step a measurement holds. Nor does it hold what the terms below carry: where the
steps moved across the window, ``drift`` carries the move, so the spread is of the two sides brought together by it;
where the profiler's cost is measured, the cost's standard error holds their median's own error (as it takes the
replayed median's place in ``steps``), so the bound is the run's median's part of their interval alone.

The level the point stands on (``RunLevel``, from the run's own unprofiled steps and the model's
check on the profiled run). Where the profiler's cost is measured, the point stands on the unprofiled
steps' level (its op times corrected by their ratio to the profiled steps, or shifted to it), so the
replayed median's own error cancels in that ratio: the cost's standard error (of both medians) takes
its place in ``steps``, which keeps the measured run's median's share (``point_own``). On the namespace testbed the measured steps missed the step-spread
interval mostly as a whole cell at a time (every step of a cell on one side): the level, not the
step, was off. Three measured sources of that:

- ``profiler_cost``: the measurement is of unprofiled steps, the point of profiled ones (less the
  profiler's cost, when it was corrected). That cost is a difference of two medians of few steps:
  its standard error (normal quantile) widens both sides. Where it was corrected, the correction is one factor on
  the host work (``remove_profiler_cost``), found so that the profiled model drops by the cost: the cost's two
  ends give two more factors (``cost_factors``), and the scenario is replayed at each, as ``link`` does for the
  transfers. A scenario whose step is more host work than the profiled one's (an unshaped link, more ranks on the
  cores) moves more with the factor than the profiled step's share says: on a wire-bound 1 Gbit/s testbed profile
  (a 5.6 +- 1.5 % cost, the factor 0.51) the unshaped cells' points moved 40 % with it while the share widened them
  2.5 %. Where it was not corrected (``--raw``, or
  too noisy, or the unprofiled steps ran slower), the unprofiled steps' offset from the profiled
  ones is a known shift of this very run, and widens the side it points to.
- ``model``: the model the what-ifs start from (modelled communication, averaged steps) against the
  measured profiled run: a bias of the model on this run that every scenario inherits; it widens
  the side it points to.
- ``drift``: unprofiled steps both before and after the profiled window show how far the job's
  level moved across it (a shared machine's load drifts by more than its steps' spread): the
  change of their medians, less (in quadrature) what the medians' own noise explains, is taken as
  the standard deviation of the level's change; the measurement is another run, later, so it
  widens both sides (normal quantile). Only a profile with unprofiled steps past the warm-up on
  both sides of its window measures it.

These are shares of the profiled step; a graph whose compute is a larger share of its step (an optimizer's strategy)
takes the spreads in proportion (``RunLevel.for_compute``): the load they measure moves the compute.

A shift is not a spread: it adds to its side after the spreads' quadrature (the point itself is
kept, so the interval still holds it). The low end is never below the replay with every collective free (no
transfer, no join's overhead: the compute and host work alone, ``compute_floor``), as a share of the replayed
iteration, at the pace of the profile's fastest replayed step (its compute may run that much below the point: a
compute-bound job's floor is not its point), lowered by a known shift that puts the job below the point: spreads wide enough to reach it (a Horovod run
whose unprofiled steps spread +-104 % put it at 0.00 ms) are cut there, and ``terms`` says so with ``compute_floor``.
That bound is the model's own, for the scenario: a run whose compute is faster than the profile's (beyond that shift)
is outside what the profile can tell.

- ``level`` (FSDP profiles, both sides, at least; it lowers the floor too): a shared machine's level moving between the
  profile and a run by more than it moved across the profiled window (the same job's median step moved 16-35 % between
  rounds minutes apart on the 2-core testbed). No quantity of one profile tells where the later run's level will be,
  but how far it may be is told by the job's unprofiled single steps: a load that moved one step may hold a whole run.
  Their 90 % half-width (``step_spread``: the normal quantile on 1.4826 x their median absolute deviation, robust to the
  odd stalled step) is the least each side reaches. Measured on 14 kept FSDP2 part-12 rounds (``bench/bench_fsdp.py
  --part 12``, 2026-12-06; the profile's unprofiled steps' median against its setup's job measured a minute later,
  -9.8 to +25.0 %): of what a profile knows, its steps' spread ranks with that gap (Spearman 0.65 for the unprofiled
  steps' median's half-width, 0.60 for the window's inter-quartile range; the profiler's in-run cost -0.08, other
  processes' CPU 0.46, the ranks' CPU skew -0.01), and the single steps' half-width held it in 12 of 14 rounds where the
  median's (``unprofiled_steps``) held 8. Left out for DDP and the other frameworks, measured without it: their kept
  runs' intervals held 89 % (``bench/bench_coverage.py``, 58 of 65), inside the goal's 80-95 %.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable

import numpy as np

from ..graph.build_fsdp import is_fsdp_graph
from ..graph.dag import Graph
from ..graph.meta import LoopSteps
from ..graph.provenance import provenance
from ..passes.profiler_cost import (
    ModelReplays,
    ProfilerCost,
    bound_factor,
    find_factor,
    job_sched,
    job_steps,
    median_stderr,
    scale_host_work,
    steady_from,
    window_sides,
)
from ..replay import ReplayResult
from ..traces.events import Kind
from ..units import figure
from .breakdown import job_iteration_us
from .operand_stall import stall_halfwidth_us

LEVEL = 0.9
# Fewer unprofiled steps give no floor: at 3 or 4, Student-t's 2.9-4.3 times one stalled step's deviation is an interval
# no one can plan with (a Horovod run's 3: +-2,300 %), where 5 give t = 2.1.
MIN_UNPROFILED_STEPS = 5
BOOTSTRAP = 2000  # resamples of the steps for their median's standard error (``median_spread``): its own noise ~2 %


@dataclass(frozen=True)
class RunLevel:
    """Where the job's own steps sit against the level a prediction stands on, as shares of the point (module docstring)."""

    shift: float = 0.0  # known: the job runs this share above the point (negative: below)
    stderr: float = 0.0  # standard error of the measured level (the profiler's cost)
    drift: float = 0.0  # standard deviation of the job's level change across the profiled window, either way
    unprofiled: float = 0.0  # half-width of the interval for a run's median step that the job's own unprofiled steps give (at LEVEL)
    unprofiled_own: float = 0.0  # the part of ``unprofiled`` that is their median's own error (``widened``)
    terms: tuple[str, ...] = ()  # which of profiler_cost, model, drift, unprofiled_steps (compute_pace: ``for_compute``) were measured
    pace: tuple[float, float] = (0.0, 0.0)  # how far the job's compute pace went below / above its median step to step (``compute_pace``)
    compute: float = 0.0  # the share of the point that ``pace`` moves: compute beyond the profiled share (``for_compute``; 0: none)
    host: tuple[float, float] = (1.0, 1.0)  # the correction's host-work factor at the cost's high and low ends, over its own (``cost_factors``)
    level: float = 0.0  # half-width (at LEVEL) of where a later run's level may sit: the unprofiled single steps' (``step_spread``)

    def for_compute(self, share: float, profiled_share: float) -> "RunLevel":
        """The level's spreads (the profiler cost's error, the drift, the unprofiled steps') for a graph whose compute is
        ``share`` of its step (``compute_floor``), where the profiled setup's was ``profiled_share``: they are the job's
        CPU moving (a shared machine's load, the profiler's hooks), measured as shares of the profiled step, so they move
        the compute alone, by the same time per unit of compute. The shift (the model's miss on the profiled run, or a
        known profiler cost) stays as measured. An optimizer strategy's step can be mostly CPU where the profiled one was
        mostly wire (PowerSGD at 200 Mbit/s): on five kept ``bench_optimize.py`` runs (held-out embedding twice, conv twice,
        LSTM; load 3.1-8.9) the strategy's interval held 6 of 13 round medians with the defaults' shares, 9 of 13 so
        (width median 43 -> 58 % of the point; the defaults' own 20 of 26, unchanged). The compute a graph holds beyond the
        profiled share also moves at the job's compute pace (``pace``, ``compute_pace``), which the profiled steps' level,
        mostly wire, barely shows: on ten kept runs (load 1.4-27) the strategies' intervals held 15 -> 18 of 24 round
        medians (19 with the compute floor at that pace too), the defaults' 40 of 48 unchanged (with the pace on the whole
        share, not only beyond the profiled one: 19 of 24 and 47 of 48, wider than the goal's 95 %)."""
        if share <= 0 or profiled_share <= 0:
            return self
        f = share / profiled_share
        paced = (share - profiled_share, ("compute_pace",)) if max(self.pace) > 0 and share > profiled_share else (0.0, ())
        return replace(self, stderr=self.stderr * f, drift=self.drift * f, unprofiled=self.unprofiled * f, unprofiled_own=self.unprofiled_own * f,
                       level=self.level * f,
                       compute=paced[0], terms=self.terms + paced[1])


def run_level(g: Graph, cost: ProfilerCost, corrected: bool, model_us: float | None = None, reference_us: float | None = None,
              host: tuple[float, float] = (1.0, 1.0)) -> RunLevel:
    """The ``RunLevel`` of the profiled graph ``g`` (its ``meta.loop_steps``): ``cost`` as measured on it and whether its
    op times were ``corrected`` by it; ``model_us`` the model of the profiled run the what-ifs start from, against the
    ``reference_us`` it should give (the measured step, less the profiler's cost when corrected); ``host``: the
    correction's factors at the cost's ends (``cost_factors``; (1, 1): the cost's share widens every scenario alike)."""
    shift, stderr, terms = 0.0, 0.0, []
    p, u = cost.profiled_us, cost.unprofiled_us
    if p and u and cost.stderr_us is not None:
        stderr = cost.stderr_us / p
        shift = 0.0 if corrected and cost.usable else (u - p) / p
        terms.append("profiler_cost")
    if model_us and reference_us:
        shift = (1.0 + shift) * reference_us / model_us - 1.0
        terms.append("model")
    drift = unprofiled = level = 0.0
    loop = g.meta.loop_steps
    if loop is not None and g.meta.steps:
        before, after = window_sides(loop, g.meta.steps, g.meta.job_of)
        profiled = job_steps(loop.profiled, set(g.meta.steps), g.meta.job_of)
        if len(before) >= 2 and len(after) >= 2 and profiled:  # the change beyond what the two medians' noise explains
            change = statistics.median(after) - statistics.median(before)
            noise = math.hypot(median_stderr(before), median_stderr(after))
            moved = math.copysign(math.sqrt(max(change**2 - noise**2, 0.0)), change)
            drift = abs(moved) / statistics.median(profiled)
            terms.append("drift")
            # the drift term carries that move: the two sides brought together by it, so the steps' spread leaves it out
            before, after = [x + moved / 2 for x in before], [x - moved / 2 for x in after]
        enough = len(before) + len(after) >= MIN_UNPROFILED_STEPS
        unprofiled = median_spread(before + after) if enough else 0.0
        terms += ["unprofiled_steps"] * (unprofiled > 0)
        level = step_spread(before + after) if enough and is_fsdp_graph(g) else 0.0
        terms += ["level"] * (level > 0)
    # median_spread for a run as long as the steps: their median's own error and the run's, equal, in quadrature
    return RunLevel(shift, stderr, drift, unprofiled, unprofiled / math.sqrt(2), tuple(terms), compute_pace(loop) if loop is not None else (0.0, 0.0),
                    host=host if corrected and stderr > 0 else (1.0, 1.0), level=level)


def cost_factors(g: Graph, cost: ProfilerCost, factor: float, iteration_us: Callable[[Graph], float], model: Graph | None = None) -> tuple[float, float]:
    """The host-work factors that the profiler cost's ``LEVEL`` interval ends give (its standard error, normal quantile),
    each found as the correction's ``factor`` was (``find_factor`` on ``g`` under ``model``), over ``factor``:
    (more removed, less removed; at most none). (1, 1) where nothing was corrected. Where the correction is bounded
    (``passes.profiler_cost.bound_factor``, whose docstring says why), the range reaches from the bound to the factor
    found on the step alone (``find_factor`` unbounded) at the cost's ends."""
    if not cost.usable or not cost.stderr_us or factor <= 0:
        return 1.0, 1.0
    half = statistics.NormalDist().inv_cdf(0.5 + LEVEL / 2) * cost.stderr_us
    replays = ModelReplays(g if model is None else model, iteration_us)  # the model as it is, replayed once for both ends
    more = find_factor(g, replace(cost, unprofiled_us=cost.unprofiled_us - half), replays, bounded=False) or 1.0
    less_cost = replace(cost, unprofiled_us=cost.unprofiled_us + half)
    less = (find_factor(g, less_cost, replays, bounded=False) or 1.0) if less_cost.share > 0 else 1.0
    bound = bound_factor(g, cost)
    if bound is not None:  # the point is bounded: the range reaches from its factor to the step's reading at the cost's ends
        more, less = min(more, bound), max(less, bound)
    return more / factor, less / factor


def compute_pace(loop: LoopSteps, level: float = LEVEL) -> tuple[float, float]:
    """How far below and above its median the job's compute pace went across its steps past the warm-up, profiled and not,
    at ``level`` (shares): per step, the ranks' training threads' CPU plus their waits for a core over their CPU. A later
    run's compute moves with a shared machine's load as its steps' did, not as their median: in the kept
    ``bench_optimize.py`` rounds (11 runs, load 1.4-27) the forward, beside which nothing runs, took 0.3-3.5x between the
    two runs of a round, seconds apart (sd of the log 0.47 over 54 rank-rounds where both ran DDP's layouts, 0.42 over 52
    where one ran PowerSGD), tracking their training threads' stretch (correlation of the logs 0.73 / 0.75). (0, 0) where
    fewer than ``MIN_UNPROFILED_STEPS`` steps recorded it."""
    first, profiled = steady_from(loop), set().union(*loop.profiled.values())
    cpu, wait = ([x for only in (None, profiled) for x in job_sched(loop, only, first, f)] for f in ("cpu_us", "wait_us"))
    stretch = [(c + w) / c for c, w in zip(cpu, wait) if c > 0]
    if len(stretch) < MIN_UNPROFILED_STEPS:
        return 0.0, 0.0
    lo, mid, hi = np.quantile(stretch, [(1.0 - level) / 2, 0.5, (1.0 + level) / 2])
    return float(1.0 - lo / mid), float(hi / mid - 1.0)


def step_spread(steps, level: float = LEVEL) -> float:
    """Half-width, as a share of their median, of the ``level`` interval of one step like ``steps``: the normal quantile on
    1.4826 x their median absolute deviation (a normal's standard deviation, which one stalled step does not move); 0
    under 2 steps. Where a later run's level may sit (``RunLevel.level``)."""
    x = np.asarray(steps, dtype=float)
    med = float(np.median(x)) if len(x) else 0.0
    if len(x) < 2 or med <= 0:
        return 0.0
    return statistics.NormalDist().inv_cdf(0.5 + level / 2) * 1.4826 * float(np.median(np.abs(x - med))) / med


def median_spread(steps, level: float = LEVEL, runs: int | None = None) -> float:
    """Half-width, as a share of their median, of the ``level`` interval for the median step of a run of ``runs`` steps
    like ``steps`` (default: as many) about their median: Student-t (n - 1) on the bootstrap standard error of their
    median (a stalled step counts as the run's median counts it), times sqrt(1 + n / runs) for the run's own median's
    error beside theirs; 0 under 2 steps. The resampling is seeded: the same steps give the same interval."""
    x = np.asarray(steps, dtype=float)
    n = len(x)
    med = float(np.median(x)) if n else 0.0
    if n < 2 or med <= 0:
        return 0.0
    medians = np.median(x[np.random.default_rng(0).integers(0, n, (BOOTSTRAP, n))], axis=1)
    return _t_quantile(0.5 + level / 2, n - 1) * float(np.std(medians, ddof=1)) / med * math.sqrt(1 + n / (runs or n))


@dataclass(frozen=True)
class PredictionInterval:
    """A predicted iteration time and the interval a run's median step should fall in, ``level`` of the time (us)."""

    point_us: float
    lo_us: float
    hi_us: float
    level: float = LEVEL
    steps: int = 0  # replayed steps the spread comes from (< 2: no step spread)
    residual_steps: int = 0  # profiled steps whose link-model residuals widened it (0: communication not modelled)
    terms: tuple[str, ...] = ()  # the sources that widened it (module docstring)
    floor: float = 0.0  # the unprofiled steps' half-width (share of the point) where it set a side, else 0
    point_own: float = 0.0  # the replayed steps' median's own error inside ``steps`` (share of the point; ``widened``)
    compute_share: float = 0.0  # the replayed iteration's share that is compute and host work alone (``compute_floor``; 0: not known)

    def text(self) -> str:
        """``1,417 ms (1,380-1,452, 90 %)``."""
        return f"{figure(self.point_us / 1e3)} ms ({figure(self.lo_us / 1e3)}-{figure(self.hi_us / 1e3)}, {100 * self.level:.0f} %)"

    def contains(self, us: float) -> bool:
        return self.lo_us <= us <= self.hi_us

    def scaled(self, factor: float) -> "PredictionInterval":
        """The same interval per micro-batch, per sample..., all three times multiplied by ``factor``."""
        return replace(self, point_us=self.point_us * factor, lo_us=self.lo_us * factor, hi_us=self.hi_us * factor)

    def widened(self, run: RunLevel, cost: tuple[float, float] | None = None) -> "PredictionInterval":
        """Also the uncertainty of the level the point stands on: each side at least ``run``'s unprofiled steps' own
        interval, then ``run``'s spreads in quadrature with it, its shift added to the side it points to. ``cost``: how far
        below and above the point the scenario replayed at the profiler cost's ends went (shares, ``predict_interval``),
        in place of the cost's share of the profiled step."""
        if not run.terms or self.point_us <= 0:
            return self
        z = statistics.NormalDist().inv_cdf(0.5 + self.level / 2)
        sides = (z * run.stderr,) * 2 if cost is None else cost
        below2, above2 = (c**2 + (z * run.drift) ** 2 + (run.compute * p) ** 2 for c, p in zip(sides, run.pace))  # the pace's at ``level``
        base = self
        if run.stderr > 0 and self.point_own > 0:  # the point stands on the unprofiled steps' level (corrected or shifted to it):
            # its error is the profiler cost's standard error (the profiled and unprofiled medians'), not the replayed median's too
            below, above = (math.sqrt(max(side**2 - self.point_own**2, 0.0)) for side in self._sides())
            base = replace(self, lo_us=self.point_us * (1.0 - below), hi_us=self.point_us * (1.0 + above))
        # so the unprofiled steps' interval keeps only the run's median's error, their median's own being in the cost's too
        least = math.sqrt(max(run.unprofiled**2 - run.unprofiled_own**2, 0.0)) if run.stderr > 0 else run.unprofiled
        least = max(least, run.level)  # a later run's level may sit where a single step did
        floor = least if least > min(base._sides()) else 0.0
        out = base._plus(below2, above2, run.terms, at_least=least, shift=run.shift, floor=floor)
        if "compute_floor" in self.terms:  # the least a run takes by the model (``predict_interval``), set before: kept.
            # optimize widens its intervals after the search, and printed FSDP2 U-Net intervals from 0.00 ms. Where the compute
            # pace applies, at its fastest: a wire-bound profile's fastest step barely outpaced its median, its compute did
            paced = (1.0 - run.pace[0] if run.compute > 0 else 1.0) * (1.0 - run.level)
            out = replace(out, lo_us=max(out.lo_us, min(self.lo_us * (1.0 + min(run.shift, 0.0)) * paced, self.point_us)))
        return out

    def with_stall(self, halfwidth_us: float, held_us: float | None = None, term: str = "operand_stall") -> "PredictionInterval":
        """Also a time the point cannot tell, a stall (``analysis.operand_stall``) or a price's sampling error (``wake_up``:
        DDP -> FSDP's wake-ups, ``search.whatif``): ``halfwidth_us`` either way, in quadrature; below, no more than the
        point holds of it (``held_us``; None: not known)."""
        if halfwidth_us <= 0 or self.point_us <= 0:
            return self
        down = halfwidth_us if held_us is None else min(halfwidth_us, held_us)
        return self._plus((down / self.point_us) ** 2, (halfwidth_us / self.point_us) ** 2, (term,))

    def above(self, extra_us: float, term: str) -> "PredictionInterval":
        """The high end raised by ``extra_us``, a cost the point leaves out and bounds (not a spread: added, not in
        quadrature); the point and the low end are kept."""
        if extra_us <= 0 or self.point_us <= 0:
            return self
        return self._plus(0.0, 0.0, (term,), shift=extra_us / self.point_us)

    def below(self, less_us: float, term: str) -> "PredictionInterval":
        """The low end lowered by ``less_us``, a time the point holds and may not take (``above``'s other side)."""
        if less_us <= 0 or self.point_us <= 0:
            return self
        return self._plus(0.0, 0.0, (term,), shift=-less_us / self.point_us)

    def at_least(self, floor_us: float) -> "PredictionInterval":
        """The low end cut at ``floor_us`` where it reaches below it (``compute_floor``), with ``compute_floor`` in ``terms``."""
        if self.lo_us >= floor_us:
            return self
        return replace(self, lo_us=min(floor_us, self.point_us), terms=self.terms + ("compute_floor",))

    def _sides(self) -> tuple[float, float]:
        """How far the interval reaches below and above the point, as shares of it."""
        return 1.0 - self.lo_us / self.point_us, self.hi_us / self.point_us - 1.0

    def _plus(self, below2: float, above2: float, terms: tuple[str, ...], at_least: float = 0.0, shift: float = 0.0,
              floor: float | None = None) -> "PredictionInterval":
        """The one way a source of error widens the interval: each side (a share of the point), at least ``at_least``, in
        quadrature with the squared shares ``below2`` / ``above2`` (independent spreads), then a known ``shift`` added to the
        side it points to, after the quadrature (a shift is not a spread); the point is kept. ``floor``: None keeps it."""
        below, above = self._sides()
        lo = math.sqrt(max(below, at_least) ** 2 + below2) + max(-shift, 0.0)
        hi = math.sqrt(max(above, at_least) ** 2 + above2) + max(shift, 0.0)
        new = tuple(t for t in terms if t not in self.terms)
        return replace(self, lo_us=self.point_us * max(1.0 - lo, 0.0), hi_us=self.point_us * (1.0 + hi), terms=self.terms + new,
                       floor=self.floor if floor is None else floor)

    def to_dict(self) -> dict:
        """The point as ``predicted_iter_ms`` (where the interval's point is the prediction: ``optimize``, ``--verify``), then
        ``bounds_dict``."""
        return {"predicted_iter_ms": self.point_us / 1e3, **self.bounds_dict()}

    def bounds_dict(self) -> dict:
        """The interval without its point (a what-if row names its point apart: ``search.whatif_row``)."""
        return {"lo_ms": self.lo_us / 1e3, "hi_ms": self.hi_us / 1e3, "level": self.level, "interval": self.text(),
                "interval_basis": {"steps": self.steps, "residual_steps": self.residual_steps, "terms": list(self.terms),
                                   "unprofiled_floor_pct": 100 * self.floor}}


def step_times(g: Graph, res: ReplayResult) -> np.ndarray:
    """Replayed time of each step (us): per rank, one step mark to the next; per step, the job's (``GraphMeta.job_of``:
    the slowest rank's)."""
    return _job_steps(g, res.start)


def measured_step_times(g: Graph) -> np.ndarray:
    """Measured time of each step (us), read as ``step_times`` reads a replay: from the step marks' measured starts
    (``graph.provenance``); empty where the graph holds none."""
    p = provenance(g)
    return np.empty(0) if p is None else _job_steps(g, p.mstart)


def _job_steps(g: Graph, start: np.ndarray) -> np.ndarray:
    per_rank = []
    for r in g.ranks():
        marks = np.flatnonzero((g.kind == Kind.STEP) & (g.rank == r))
        if len(marks) >= 2:
            per_rank.append(np.diff(np.sort(start[marks])))
    if not per_rank or not all(np.isfinite(p).all() for p in per_rank):
        return np.empty(0)
    n = min(len(p) for p in per_rank)
    return np.array([g.meta.job_of(step.tolist()) for step in np.array([p[:n] for p in per_rank]).T])


def typical_iteration_us(g: Graph, res: ReplayResult) -> float:
    """The median over steps of the job's step (``step_times``: the slowest rank's): what ``--verify`` and the benches measure
    on the job (``collect.hooks.steptimes.iteration_ms``), so a step that a neighbour's load stalled counts as one
    step, as there, not spread over all of them as a mean is; ``job_iteration_us`` where fewer than 3 steps were replayed."""
    d = step_times(g, res)
    return float(np.median(d)) if len(d) >= 3 else job_iteration_us(g, res)


class StepStatistic(str, Enum):
    """How a price sums up a run's steps, and so what measurement it is held against."""

    MEDIAN = "median"  # the median step of the job (the slowest rank's; ``typical_iteration_us``)
    MEAN = "mean"  # the mean step (``job_iteration_us``)


def measured_step_us(g: Graph, statistic: StepStatistic) -> tuple[float | None, StepStatistic]:
    """The profiled run's typical measured step (us; None: not measured), summed up as ``statistic`` says, and the
    statistic it is: what a model priced by that statistic must be held against. ``MEAN``: the slowest rank's mean
    step (a parameter server's workers' mean, ``GraphMeta.job_of``, of ``graph.meta.measured_iter_us``;
    ``job_iteration_us`` of the measurement, ``Analysis.measured_us``).
    ``MEDIAN``: ``typical_iteration_us`` of the measurement (``measured_step_times``) where 3 or more steps were
    measured, else the mean (and ``MEAN`` says so)."""
    if statistic is StepStatistic.MEDIAN:
        d = measured_step_times(g)
        if len(d) >= 3:
            return float(np.median(d)), StepStatistic.MEDIAN
    per_rank = list(g.meta.measured_iter_us.values())
    return (float(g.meta.job_of(per_rank)) if per_rank else None), StepStatistic.MEAN


def link_residuals(profiled: Graph, modelled: Graph) -> np.ndarray:
    """Per profiled step: its measured communication over the same collectives as the link model prices them.

    ``profiled`` is the graph as measured; ``modelled`` the same graph after ``set_topology`` (same
    nodes). Steps without a priced transfer are left out.
    """
    comm = (profiled.kind == Kind.COMM) & (profiled.rank < 0) & (profiled.step >= 0)
    if len(modelled) != len(profiled) or not comm.any():
        return np.empty(0)
    steps, inverse = np.unique(profiled.step[comm], return_inverse=True)
    measured = np.bincount(inverse, weights=profiled.dur[comm], minlength=len(steps))
    model = np.bincount(inverse, weights=modelled.dur[comm], minlength=len(steps))
    ok = model > 0
    return measured[ok] / model[ok]


def predict_interval(g: Graph, res: ReplayResult, point_us: float | None = None, residuals: np.ndarray | None = None,
                     level: float = LEVEL, run: RunLevel | None = None, stall_bound_us: float = 0.0,
                     stall_held_us: float | None = None, wake_up: tuple[float, float] = (0.0, 0.0)) -> PredictionInterval:
    """The interval around ``point_us`` (default: ``g``'s replayed iteration) from ``g``'s replayed steps and, when
    ``g``'s communication is modelled (``meta.topology`` set), the link ``residuals`` (``link_residuals``); the stall a
    step's collectives may take at random up to ``stall_bound_us``, of which the point holds at most ``stall_held_us``
    (``analysis.operand_stall``); ``wake_up``: the half-width (us, at ``level``) of a step's priced wake-ups from their
    price's sampling error, and what the point holds of them (DDP -> FSDP, ``search.whatif``); widened by ``run``
    (``run_level``), the uncertainty of the level the point stands on."""
    point = job_iteration_us(g, res) if point_us is None else point_us
    d = step_times(g, res)
    runs = max(len(d), 1)  # the measured run's steps: as many as the profiled window's
    step = median_spread(d, level)
    lo2 = hi2 = step**2
    used = 0
    if residuals is not None and len(residuals) >= 2 and g.meta.topology is not None:
        comm = (g.kind == Kind.COMM) & (g.rank < 0)
        spread = median_spread(residuals, level, runs)
        if comm.any() and spread > 0:
            base = job_iteration_us(g, res)
            low = job_iteration_us(g.replace(dur=np.where(comm, g.dur * max(1.0 - spread, 0.0), g.dur)))
            high = job_iteration_us(g.replace(dur=np.where(comm, g.dur * (1.0 + spread), g.dur)))
            lo2 += (max(base - low, 0.0) / base) ** 2
            hi2 += (max(high - base, 0.0) / base) ** 2
            used = len(residuals)
    terms = ("steps",) * (step > 0) + ("link",) * (used > 0)
    out = PredictionInterval(point, point * max(1.0 - math.sqrt(lo2), 0.0), point * (1.0 + math.sqrt(hi2)), level, len(d), used, terms,
                             point_own=step / math.sqrt(1 + len(d) / runs) if len(d) else 0.0)
    out = out.with_stall(stall_halfwidth_us(stall_bound_us, level), stall_held_us).with_stall(*wake_up, term="wake_up")
    out = out if run is None else out.widened(run, _cost_sides(g, res, run))
    fastest = float(np.min(d) / np.median(d)) if len(d) >= 2 and np.median(d) > 0 else 1.0  # the profile's fastest step's pace
    share = compute_floor(g, res)
    # the floor's replay holds the wake-ups at the point's price, host work on the main lane: lowered by as much as their price may be
    below = min(wake_up) if wake_up[0] > 0 else 0.0
    # a run at a faster level (``RunLevel.level``) runs its compute faster too
    level = (1.0 + min(run.shift, 0.0)) * (1.0 - run.level) if run is not None else 1.0
    return replace(out.at_least(point * share * fastest * level - below), compute_share=share)


def _cost_sides(g: Graph, res: ReplayResult, run: RunLevel) -> tuple[float, float] | None:
    """How far below and above ``g``'s replayed iteration the profiler cost's ends take it (shares): ``g`` replayed with its
    host work at ``run.host``'s factors (the correction's at the cost's ends, ``cost_factors``); None where not found."""
    if run.host == (1.0, 1.0) or run.stderr <= 0:
        return None
    base = job_iteration_us(g, res)
    if base <= 0:
        return None
    more, less = (job_iteration_us(scale_host_work(g, f)) for f in run.host)
    return max(base - more, 0.0) / base, max(less - base, 0.0) / base


def compute_floor(g: Graph, res: ReplayResult) -> float:
    """The replayed iteration with every collective free (its transfer and its overhead at 0: compute and host work
    alone) over ``g``'s replayed iteration (``res``): the least share of the point a run can take by the model."""
    comm = g.kind == Kind.COMM
    base = job_iteration_us(g, res)
    if not comm.any() or base <= 0:
        return 0.0
    return min(job_iteration_us(g.replace(dur=np.where(comm, 0.0, g.dur), gap=np.where(comm, 0.0, g.gap))) / base, 1.0)


def student_halfwidth(stderr: float, dof: int, level: float = LEVEL) -> float:
    """Half-width of the ``level`` interval of a mean with standard error ``stderr`` over ``dof`` degrees of freedom."""
    return _t_quantile(0.5 + level / 2, dof) * stderr


def _t_quantile(p: float, dof: int) -> float:
    """Student-t quantile (Cornish-Fisher expansion about the normal; within 1 % for dof >= 3, wider below)."""
    z = statistics.NormalDist().inv_cdf(p)
    if dof <= 0:
        return z
    if dof <= 2:  # exact for 1 and 2 degrees of freedom
        q = 2 * p - 1 if p >= 0.5 else 1 - 2 * p
        x = math.tan(math.pi * q / 2) if dof == 1 else q * math.sqrt(2 / (1 - q * q))
        return x if p >= 0.5 else -x
    v = float(dof)
    return z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2) + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
