"""Search DDP strategies by replay: dPRO's optimizer for PyTorch DDP.

A candidate is a bucket layout (bucket ends in gradient-ready order, DDP's first bucket
included), a gradient codec (``--allow-lossy``: fp16, bf16, PowerSGD rank r), a partition count,
a set of recomputed modules (under ``--memory-budget``) and, only when asked, a number of
micro-batches per step. Every candidate is priced on the run's own graph: the profiled ops
with their measured times, the buckets re-formed and priced by the link model fitted to the
run's collectives (``passes.bucket_plan``), each codec at its measured cost.

How it searches:
- seeds: the profiled layout, DDP-style layouts for a grid of bucket caps, one bucket per layer
  and one bucket for all, each with every allowed codec (``anneal``);
- then simulated annealing from the best seed. Half of the moves are guided by the replayed
  critical path, as dPRO does: a bucket whose all-reduce is on the path because it became ready
  late is split (so part of it starts earlier); one on the path behind a busy channel is merged
  (fewer per-collective costs) or compressed; the rest are random boundary moves, codec, partition
  and recomputation changes;
- on CPU jobs, compute beside in-flight collectives runs slower (``passes.overlap``, with the slowdown
  the profile measured on the job's ranks): each candidate is replayed once to see its overlap and
  once charged for it;
- each candidate only changes slot durations of one graph, so replay is incremental
  (``IncrementalReplayer``), and ranks that are structurally identical are simulated once
  (``graph.symmetry``, averaged); the baseline and the best few are then replayed on the full graph,
  which gives the reported prediction.

Deterministic for a seed: the same candidates are proposed in the same order; the budget only
decides how far down that sequence the search gets, and it stops earlier once ``patience``
proposals in a row found nothing better.

FSDP2 jobs have other knobs (reshard_after_forward per unit, the reduce dtype): ``search.fsdp_optimize``.

Where each part lives: the candidate, its knobs and moves and the strategy file's fields for each
(``candidate.KNOBS``), the pricing by replay (``evaluate``), seeds and annealing (``anneal``), the
starting point under a memory budget (``memory_fit``), what the job measured (``measured``); this
module runs them and judges the finalists on the full graph.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar

from ..analysis.interval import PredictionInterval, StepStatistic, link_residuals, predict_interval
from ..collect.deploy.strategy import Prediction, Strategy
from ..costmodel.codecs import Codec, CodecCosts
from ..errors import DagprofError
from ..graph.dag import Graph
from ..graph.symmetry import fold_ranks
from ..passes.accumulate import check_accumulation
from ..passes.comm import current_topology, set_topology
from ..passes.compression import UNMEASURED, Chained, chained_text, nonempty_allreduces
from ..passes.gradients import GradientOrder, gradient_order
from ..passes.link_fit import graph_world_size, link_fit
from ..passes.overlap import core_bound_slowdown
from ..passes.recompute import Segment, segments
from ..replay import ReplayResult
from ..traces.events import Kind, Run
from ..units import MB
from .anneal import anneal, seeds
from .candidate import Candidate, Space, candidate_of, complexity, strategy_fields
from .evaluate import Evaluator, Scored
from .measured import NOT_MEASURED, chained_in_job, chained_unmeasured, codec_costs, in_job, job_overlap, or_calibrated, profiled_stretch, slowdown_in
from .memory import MemoryModel, autograd_host
from .memory_fit import fit_memory
from .scenario import Cluster, Scenario, profiled_at
from .shared_cores import CoreBounds, comm_slowdown_beside, on_shared_cores, shared_cores_bounds, shared_cores_note, unslowed_profile
from .wire_notes import profiled_wire_notes

__all__ = ["Candidate", "Options", "Priced", "Progress", "Scored", "SearchResult", "WORTH_APPLYING_PCT", "predict_run", "search", "search_run"]

WORTH_APPLYING_PCT = 2.0  # a predicted gain below this is within run-to-run noise here: keep the current setup
FINAL_CHECK = 8  # best candidates re-replayed on the full (unfolded) graph
TIE_PCT = 0.3  # finalists this close to the best count as equal; the simplest wins
POWERSGD_RANKS = (2, 4)  # PowerSGD ranks a lossy search tries unless told (``dagprof optimize --powersgd-ranks``)


@dataclass(frozen=True)
class Progress:
    replayed: int
    elapsed_s: float
    budget_s: float
    best_ms: float
    baseline_ms: float


@dataclass
class Options:
    budget_s: float = 30.0
    seed: int = 0
    allow_lossy: bool = False
    powersgd_ranks: tuple[int, ...] = POWERSGD_RANKS
    accumulate: int = 1  # > 1: also consider this many micro-batches per step
    memory_budget: float | None = None  # bytes per rank
    optimizer_state: str = "momentum"
    max_candidates: int = 20_000
    patience: int = 400
    symmetry: bool = True
    overlap_slowdown: float | None = None  # compute slowdown per unit of overlap with collectives (None: as measured for the run, else 0)
    overlap_rate: float | None = None  # bytes/s of the all-reduce the slowdown was measured beside (None: every collective counts whole)
    link_model: str | None = None  # a ``dagprof calibrate --overlap`` file: what the run measured none of (``measured.overlap_of``)
    # the wire rate the run was profiled at (``dagprof optimize --profiled-bandwidth``, whatif's flag): the fitted link read against
    # it (``search.scenario.profiled_at``) and its collectives the wire's, so no ``shared_cores`` bounds (a tc-shaped link, one host)
    profiled_bandwidth: str | None = None
    chained_allreduce: Chained = UNMEASURED  # PowerSGD's chain measured in the job's group or on its cluster (``measured.chained_in_job``)
    # price this strategy as the best, its interval too, instead of searching: a strategy kept from another profile of the
    # job, judged on this one (``bench/bench_coverage.py``: a re-search may find another layout within the tie)
    strategy: Strategy | None = None
    progress: Callable[[Progress], None] | None = None


class Gain:
    """What a search result's best candidate gains over the profiled setup (both priced by the same model)."""

    baseline: Any
    best: Any
    intervals: dict[str, PredictionInterval] | None
    step_statistic: ClassVar[StepStatistic]  # how ``iter_us`` sums up the replayed steps: the measurement is held alike

    @property
    def speedup(self) -> float:
        return self.baseline.iter_us / self.best.iter_us

    @property
    def gain_pct(self) -> float:
        return 100.0 * (self.baseline.iter_us - self.best.iter_us) / self.baseline.iter_us

    def ends(self) -> tuple[dict, dict]:
        """The baseline and the best candidate as the result's ``describe`` says them, each with its prediction interval
        where there is one: both kinds of search report them alike."""
        iv = self.intervals or {}
        base, best = (self.describe(s) | (iv[k].to_dict() if k in iv else {}) for k, s in (("baseline", self.baseline), ("best", self.best)))
        return base, best


@dataclass
class SearchResult(Gain):
    step_statistic: ClassVar[StepStatistic] = StepStatistic.MEDIAN  # ``search.evaluate.Scored``
    baseline: Scored
    best: Scored
    order: GradientOrder
    segments: list[Segment]
    replayed: int
    seconds: float
    world_size: int
    seeds: list[Scored]
    notes: list[str]
    layer_names: list[str]  # the graph's layers (module paths), to name bucket boundaries
    overlap_slowdown: float = 0.0  # what the model charged compute per unit of overlap with collectives
    memory_reason: str | None = None  # why no strategy fits the memory budget
    intervals: dict[str, PredictionInterval] | None = None  # "baseline", "best": each step replayed (per micro-batch)
    model_error_pct: float | None = None  # the baseline against the measured run (closeloop.find_strategy); None: not measured
    warnings: list[str] = field(default_factory=list)  # said above the notes: what makes the prediction less sure
    # "baseline", "best": the ``shared_cores`` bounds (above, below; us per micro-batch, ``search.shared_cores``), added to the
    # intervals once the level has widened them (``closeloop.find_strategy``); empty where the term does not apply
    shared_cores: dict[str, CoreBounds] = field(default_factory=dict)

    @property
    def worth_applying(self) -> bool:
        """Whether the best strategy is predicted far enough ahead of the current setup to apply it
        (or it is needed to fit the memory budget)."""
        memory_needed = self.baseline.memory is not None and not self.baseline.fits and self.best.fits
        return memory_needed or (self.gain_pct >= WORTH_APPLYING_PCT and self.best.candidate != self.baseline.candidate)

    def strategy(self) -> Strategy:
        o = self.order
        model = tuple((p, math.prod(s) if s is not None else -1) for p, s in zip(o.params, o.shapes))
        pred = Prediction(self.baseline.iter_us / 1e3, self.best.iter_us / 1e3, self.replayed)
        fields = strategy_fields(Space(o, self.segments, tuple(self.layer_names)), self.best.candidate)
        return Strategy(model, self.world_size, prediction=pred, notes=tuple(self.notes), **fields)

    def describe(self, s: Scored) -> dict:
        c = s.candidate
        return {"buckets": len(c.ends), "bucket_mb": [round(float(x) / MB, 3) for x in self.order.bucket_bytes(c.ends)],
                "codec": c.codec.label(), "parts": c.parts, "accumulate": c.accumulate,
                "recompute": [self.segments[i].module for i in sorted(c.recompute)], "predicted_iter_ms": s.iter_us / 1e3,
                "memory": None if s.memory is None else s.memory.to_dict(), "fits_memory": s.fits}

    def to_dict(self) -> dict:
        st = self.strategy()
        base, best = self.ends()
        return {"baseline": base, "best": best, "predicted_speedup": self.speedup,
                "predicted_gain_pct": self.gain_pct, "worth_applying": self.worth_applying, "candidates_replayed": self.replayed,
                "search_seconds": self.seconds, "seeds": [self.describe(s) for s in self.seeds], "notes": self.notes,
                "memory_reason": self.memory_reason, "summary": st.summary(), "caveats": st.caveats(),
                "model_error_pct": self.model_error_pct, "warnings": self.warnings}


def search(g: Graph, order: GradientOrder, opts: Options | None = None, costs: CodecCosts | None = None,
           layer_saved_bytes: dict[str, int] | None = None) -> SearchResult:
    """The best strategy for the run behind ``g`` (see the module docstring)."""
    opts = opts or Options()
    check_accumulation(g, opts.accumulate)  # the seeds hold it, but a timed search may not reach them
    t0 = time.perf_counter()
    rng = random.Random(opts.seed)
    wire = Cluster(profiled_bandwidth=opts.profiled_bandwidth)  # the wire it ran on, where named: as whatif reads it
    measured, g = g, profiled_at(g, wire)
    fitted = link_fit(g) if opts.profiled_bandwidth is not None and g.meta.topology is None else None  # read against the wire below
    g = set_topology(g, current_topology(g))  # one link model, fitted on every rank's collectives, before any folding
    notes = ["comm scheduling (bucket priority) not searched: DDP issues buckets in gradient-ready order and its optimizer "
             "waits for every bucket, so no order of the channel changes the iteration"]
    codecs = [Codec()]
    if opts.allow_lossy:
        if costs is None:
            raise DagprofError("--allow-lossy needs the measured codec costs")
        codecs += [Codec("fp16"), Codec("bf16")] + [Codec("powersgd", r) for r in opts.powersgd_ranks]
        if opts.powersgd_ranks and opts.chained_allreduce.allreduce:
            notes.append("PowerSGD's three all-reduces per bucket each pay the latency beyond the link model that small all-reduces "
                         "chained by completion callbacks measured in the job's group or on its cluster (" +
                         chained_text(opts.chained_allreduce.allreduce) + ")" +
                         ("; a bucket closed during the backward, as they took issued beside a busy backward (" +
                          chained_text(opts.chained_allreduce.busy) + ")"
                          if opts.chained_allreduce.busy else
                          "; during the backward too (its measurement predates the chain timed beside a busy backward)"))
    memory = None
    cand_segments: list[Segment] = []
    if opts.memory_budget is not None:
        memory = MemoryModel.from_profile(g, order, layer_saved_bytes or {}, opts.optimizer_state)
        cand_segments = segments(g)
        if note := autograd_host(g).note:
            notes.append(note)
    if opts.overlap_slowdown:
        notes.append(f"compute beside in-flight collectives modelled {opts.overlap_slowdown:.2f}x slower per unit of overlap "
                     + ("(as measured), each collective in proportion to the bytes it moves per second against the "
                        f"measured all-reduce's {opts.overlap_rate / MB:.1f} MB/s" if opts.overlap_rate else "(as given)"))
    notes += profiled_wire_notes(g, fitted, wire, [Scenario()])[1]
    if g.meta.parallel is not None and g.meta.parallel.in_ops[0]:  # the model's own collectives: not re-bucketed nor re-priced
        notes.append(g.meta.parallel.in_ops_text())
    symmetric, folded_note = _fold(g, opts)
    if folded_note:
        notes.append(folded_note)
    slowdown = opts.overlap_slowdown or 0.0
    ev = Evaluator(symmetric, order, costs, cand_segments, memory, slowdown, opts.memory_budget, comm_rate=opts.overlap_rate,
                   chained=opts.chained_allreduce)
    full = ev if symmetric is g else Evaluator(g, order, costs, cand_segments, memory, slowdown, opts.memory_budget, comm_rate=opts.overlap_rate,
                                               chained=opts.chained_allreduce)
    space = Space(order, cand_segments, tuple(g.layers), tuple(codecs))
    baseline_c = Candidate(order.profiled_ends)
    recompute0, view0, reason = fit_memory(memory, opts.memory_budget, cand_segments, ev, order)

    def report(best: float, base: float) -> None:
        if opts.progress is not None:
            opts.progress(Progress(ev.replayed + (full.replayed if full is not ev else 0), time.perf_counter() - t0, opts.budget_s,
                                   best / 1e3, base / 1e3))

    base_score, _ = ev.score(replace(baseline_c, recompute=frozenset(), bucket_view=False))
    if opts.strategy is not None:
        scored = finalists = [ev.score(candidate_of(space, opts.strategy))[0]]
    else:
        scored = anneal(ev, space, seeds(space, sorted({1, opts.accumulate}), recompute0, view0), rng, t0, opts.budget_s,
                        opts.max_candidates, opts.patience, lambda best: report(best, base_score.iter_us))
        # the reported prediction: the full graph, for the baseline and the best few distinct candidates
        finalists = sorted({s.candidate: s for s in ev.cache.values()}.values(), key=ev.objective)[:FINAL_CHECK]
    final = [full.score(s.candidate)[0] if full is not ev else s for s in finalists]
    best_full = min(final, key=full.objective)
    near = [s for s in final if full.objective(s) <= full.objective(best_full) * (1 + TIE_PCT / 100)]
    best_full = min(near, key=lambda s: (complexity(s.candidate), full.objective(s)))  # within noise, the simpler one
    base_full = full.score(replace(baseline_c, recompute=frozenset(), bucket_view=False))[0]
    if memory is not None and base_full.memory is None:
        base_full.memory = memory.peak([], Codec(), False, float(order.bucket_bytes(baseline_c.ends).max()))
        base_full.fits = opts.memory_budget is None or base_full.memory.total <= opts.memory_budget
    if opts.strategy is None and full.objective(base_full) <= full.objective(best_full) * (1 + TIE_PCT / 100):
        best_full = base_full  # nothing beats the profiled setup by more than a tie: it is the simplest of all
    if not best_full.fits:
        reason = reason or "no candidate found fits the memory budget"
    report(best_full.iter_us, base_full.iter_us)
    residuals = link_residuals(measured, g)
    intervals, cores = {}, {}
    bounds = _SharedCores.on(g, full, opts.link_model, wire)
    for name, s in (("baseline", base_full), ("best", best_full)):
        sg, res = full.score(s.candidate, keep=True)[1]  # arrays the next replay overwrites: read before the next end replays
        intervals[name] = predict_interval(sg, res, s.iter_us * s.candidate.accumulate, residuals).scaled(1 / s.candidate.accumulate)
        if bounds is not None:
            cores[name] = bounds.of(sg, res, s.candidate)
    replayed = ev.replayed + (full.replayed if full is not ev else 0)  # the search's: the bounds' replays are not candidates
    if cores:
        notes.append(shared_cores_note(g, sum(max(b) > 0 for b in cores.values()), len(cores), Cluster(link_model=opts.link_model, slowdown=slowdown)))
    seeds_out = sorted({s.candidate: s for s in scored if s.candidate.codec.name == "none" and s.candidate.accumulate == 1}.values(),
                       key=lambda s: len(s.candidate.ends))
    return SearchResult(base_full, best_full, order, cand_segments, replayed, time.perf_counter() - t0, graph_world_size(g), seeds_out, notes,
                        list(g.layers), opts.overlap_slowdown or 0.0, reason, intervals, shared_cores=cores)


@dataclass(frozen=True)
class _SharedCores:
    """How ``search`` prices its two ends' ``shared_cores`` bounds (``search.shared_cores``, as ``whatif`` puts them on a row that
    keeps the profile's link), where the profile ``g`` (on its fitted link) ran every rank on one host (``on_shared_cores``):
    from each end's step on the search's full evaluator and, where the search charged no slowdown beside collectives, the
    same candidate on the profile with its compute undisturbed at the cores' bound (``unslowed_profile``) for the low end."""

    comm_slowdown: float
    compute_slowdown: float
    unslowed: Evaluator | None

    @classmethod
    def on(cls, g: Graph, full: Evaluator, link_model: str | None, wire: Cluster) -> _SharedCores | None:
        """None where the term does not apply (several hosts or none recorded, or ``wire`` names the wire it ran on)."""
        if not on_shared_cores(g, Scenario(), wire):
            return None
        unslowed = None if full.slowdown else Evaluator(unslowed_profile(g, g, g), full.order, full.costs, full.segments, None,
                                                        recompute=full.recompute, comm_rate=full.comm_rate, chained=full.chained)
        return cls(comm_slowdown_beside(g, link_model), 0.0 if full.slowdown else core_bound_slowdown(g), unslowed)

    def of(self, sg: Graph, res: ReplayResult, c: Candidate) -> CoreBounds:
        """The bounds of candidate ``c``, replayed on the full evaluator as ``sg``, ``res``, per micro-batch. ``res`` may be an
        evaluator's buffers, which its next replay overwrites: this reads them before returning, and replays ``c`` only
        on the other evaluator (``unslowed``), whose buffers are its own."""
        ug = None if self.unslowed is None else self.unslowed.score(c, keep=True)[1][0]
        above, below = shared_cores_bounds(sg, res, self.comm_slowdown, self.compute_slowdown, ug)
        return CoreBounds(above / c.accumulate, below / c.accumulate)


def _fold(g: Graph, opts: Options) -> tuple[Graph, str | None]:
    """The graph with structurally identical ranks folded into one (averaged), when that holds."""
    if not opts.symmetry or g.world_size < 2:
        return g, None
    try:
        folded, info = fold_ranks(g, average=True)
    except DagprofError:
        return g, None
    if not info.folded:
        return g, "rank symmetry does not hold here (ranks differ in structure or share devices): every rank is replayed"
    return folded, f"rank symmetry: {len(info.classes)} of {g.world_size} ranks simulated during the search (averaged); the final prediction replays all"


def search_run(run: Run, g: Graph, opts: Options | None = None, costs_file: str | None = None, kept_costs: str | None = None) -> SearchResult:
    """``search`` on a loaded dagprof run: its DDP bucket layout and activation sizes come from rank 0's
    profile; with ``allow_lossy`` the codec costs are an earlier run's (``kept_costs``) where they fit this machine and
    model, else measured on this machine, and written in ``costs_file`` (``measured.codec_costs``; a note says which)."""
    opts = opts or Options()
    if g.meta.fsdp is not None:
        raise DagprofError("this profile is an FSDP job: its strategies are searched by search.fsdp_optimize.search_fsdp "
                           "(dagprof optimize does that)", run.source)
    if not ((g.kind == Kind.COMM) & (g.bucket >= 0)).any():
        raise DagprofError("the trace has no gradient-bucket all-reduce to re-bucket (a dagprof profile of a DDP job has them)", run.source)
    meta = run.ranks[0].meta
    order = gradient_order(g, run.ranks[0].buckets, run.ranks[0].meta.find_unused)
    # read once: PowerSGD's chained all-reduces and the slowdown, measured on the job's own ranks (our demo job), else by
    # ``calibrate --overlap`` on its cluster -- on dagprof's ranks, never inside the user's job; the codecs' yardstick
    # only from the job's own (``in_job``)
    job = job_overlap(run)
    cluster = or_calibrated(job, opts.link_model)
    found = codec_costs(order, opts.powersgd_ranks, costs_file, kept_costs) if opts.allow_lossy else None
    costs = in_job(None if found is None else found.costs, job)
    opts = replace(opts, chained_allreduce=chained_in_job(cluster, profiled_stretch(run)))
    measured = cluster if opts.overlap_slowdown is None else None
    unmeasured = opts.overlap_slowdown is None and run.ranks[0].backend == "gloo" and measured is None
    if opts.overlap_slowdown is None:
        s, rate = slowdown_in(measured)
        opts = replace(opts, overlap_slowdown=s, overlap_rate=rate)
    res = search(g, order, opts, costs, meta.layer_saved_bytes)
    if unmeasured:
        res.notes.append(NOT_MEASURED)
    if found is not None:
        res.notes.append(found.note)
    best = res.best.candidate
    if best.codec.name == "powersgd" and not opts.chained_allreduce.allreduce:
        res.warnings.append(chained_unmeasured(nonempty_allreduces(order, best.ends, best.codec.rank)))
    return res


@dataclass
class Priced:
    """A strategy priced on one profile, with the graph predicted for it (what
    ``analysis.diff.categories_vs_expected`` holds a profile of the strategy run against)."""

    prediction: Prediction
    graph: Graph


def predict_run(run: Run, g: Graph, strategy: Strategy, costs_file: str | None = None, measured_in: Run | None = None,
                link_model: str | None = None, profiled_bandwidth: str | None = None) -> Priced:
    """``strategy`` priced on this run: how a strategy found on one profile is priced on another (a later
    profile of the same job, e.g. each verification round's). ``measured_in``: the run whose overlap
    measurements (slowdown, codec yardstick, chained all-reduces) apply, default ``run``; ``link_model``: a ``calibrate --overlap`` file,
    the slowdown and the chained all-reduces where that run measured none; ``profiled_bandwidth``: the wire ``run`` ran on, as
    ``Options.profiled_bandwidth``. The codecs' CPU stretches as ``run``'s own profile measured its cores loaded
    (``measured.profiled_stretch``), where it did."""
    like = measured_in or run
    g = profiled_at(g, Cluster(profiled_bandwidth=profiled_bandwidth))
    order = gradient_order(g, run.ranks[0].buckets, run.ranks[0].meta.find_unused)
    c = strategy.compression
    job = job_overlap(like)  # read once: the codecs' yardstick (the job's own only), the chained all-reduces, the slowdown
    cluster = or_calibrated(job, link_model)
    costs = in_job(codec_costs(order, (c.rank,) if c.codec == "powersgd" else (), costs_file).costs if c.lossy else None, job)
    segs = segments(g) if strategy.recompute else []
    slowdown, rate = slowdown_in(cluster)
    ev = Evaluator(g, order, costs, segs, None, slowdown, recompute=bool(strategy.recompute), comm_rate=rate,
                   chained=chained_in_job(cluster, profiled_stretch(run)))
    cand = candidate_of(Space(order, segs), strategy)
    base = ev.score(Candidate(order.profiled_ends))[0]
    return Priced(Prediction(base.iter_us / 1e3, ev.score(cand)[0].iter_us / 1e3), ev.predicted_graph(cand))
