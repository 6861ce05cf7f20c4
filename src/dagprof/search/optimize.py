"""Search DDP strategies by replay: dPRO's optimizer for PyTorch DDP.

A candidate is a bucket layout (bucket ends in gradient-ready order, DDP's first bucket
included), a gradient codec (``--allow-lossy``: fp16, bf16, PowerSGD rank r), a partition count,
a set of recomputed modules (under ``--memory-budget``) and, only when asked, a number of
micro-batches per step. Every candidate is priced on the run's own graph: the profiled ops
with their measured times, the buckets re-formed and priced by the link model fitted to the
run's collectives (``passes.bucket_plan``), each codec at its measured cost.

How it searches:
- seeds: the profiled layout, DDP-style layouts for a grid of bucket caps, one bucket per layer
  and one bucket for all, each with every allowed codec;
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
"""
from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ..analysis import job_iteration_us
from ..analysis.critical_path import critical_path
from ..analysis.interval import PredictionInterval, link_residuals, predict_interval
from ..collect.overlap import load_overlap
from ..collect.strategy import Bucket, Compression, Prediction, Strategy
from ..costmodel.codecs import Codec, CodecCosts, powersgd_split
from ..errors import DagprofError
from ..graph.dag import Graph
from ..graph.symmetry import fold_ranks
from ..passes.accumulate import accumulate_gradients
from ..passes.bucket_plan import BucketSlots, Plan
from ..passes.comm import current_topology, graph_world_size, set_topology
from ..passes.gradients import GradientOrder, gradient_order
from ..passes.overlap import disturbed, slowed_nodes, undisturbed
from ..passes.recompute import RecomputeSlots, Segment, segments
from ..replay import ReplayResult, replay
from ..replay.incremental import IncrementalReplayer
from ..replay.numba_engine import load_kernels
from ..traces.events import Kind, Run
from ..units import MB
from .memory import MemoryBreakdown, MemoryModel

WORTH_APPLYING_PCT = 2.0  # a predicted gain below this is within run-to-run noise here: keep the current setup
SEED_CAPS_MB = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0)
PARTS = (1, 2, 4)
FINAL_CHECK = 8  # best candidates re-replayed on the full (unfolded) graph
TIE_PCT = 0.3  # finalists this close to the best count as equal; the simplest wins


@dataclass(frozen=True)
class Candidate:
    ends: tuple[int, ...]
    codec: Codec = field(default_factory=Codec)
    parts: int = 1
    recompute: frozenset[int] = frozenset()
    accumulate: int = 1
    bucket_view: bool = False

    @property
    def plan(self) -> Plan:
        return Plan(self.ends, self.codec, self.parts)


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
    powersgd_ranks: tuple[int, ...] = (2, 4)
    accumulate: int = 1  # > 1: also consider this many micro-batches per step
    memory_budget: float | None = None  # bytes per rank
    optimizer_state: str = "momentum"
    max_candidates: int = 20_000
    patience: int = 400
    symmetry: bool = True
    overlap_slowdown: float | None = None  # compute slowdown per unit of overlap with collectives (None: as measured for the run, else 0)
    progress: Callable[[Progress], None] | None = None


@dataclass
class Scored:
    candidate: Candidate
    iter_us: float  # per micro-batch
    memory: MemoryBreakdown | None = None
    fits: bool = True


@dataclass
class SearchResult:
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

    @property
    def speedup(self) -> float:
        return self.baseline.iter_us / self.best.iter_us

    @property
    def gain_pct(self) -> float:
        return 100.0 * (self.baseline.iter_us - self.best.iter_us) / self.baseline.iter_us

    @property
    def worth_applying(self) -> bool:
        """Whether the best strategy is predicted far enough ahead of the current setup to apply it
        (or it is needed to fit the memory budget)."""
        memory_needed = self.baseline.memory is not None and not self.baseline.fits and self.best.fits
        return memory_needed or (self.gain_pct >= WORTH_APPLYING_PCT and self.best.candidate != self.baseline.candidate)

    def strategy(self) -> Strategy:
        c = self.best.candidate
        o = self.order
        buckets = None
        if c.ends != o.profiled_ends:
            buckets = tuple(Bucket(o.params[a : z + 1], int(o.nbytes[a : z + 1].sum()), _layer_names(o, a, z, self.layer_names))
                        for a, z in o.bucket_params(c.ends))
        model = tuple((p, math.prod(s) if s is not None else -1) for p, s in zip(o.params, o.shapes))
        comp = Compression(c.codec.name, c.codec.rank)
        pred = Prediction(self.baseline.iter_us / 1e3, self.best.iter_us / 1e3, self.replayed)
        return Strategy(model, self.world_size, buckets, comp, c.parts, c.accumulate,
                        tuple(self.segments[i].module for i in sorted(c.recompute)), c.bucket_view, pred, tuple(self.notes))

    def describe(self, s: Scored) -> dict:
        c = s.candidate
        return {"buckets": len(c.ends), "bucket_mb": [round(float(x) / MB, 3) for x in self.order.bucket_bytes(c.ends)],
                "codec": c.codec.label(), "parts": c.parts, "accumulate": c.accumulate,
                "recompute": [self.segments[i].module for i in sorted(c.recompute)], "predicted_iter_ms": s.iter_us / 1e3,
                "memory": None if s.memory is None else s.memory.to_dict(), "fits_memory": s.fits}

    def to_dict(self) -> dict:
        st = self.strategy()
        iv = self.intervals or {}
        base, best = (self.describe(s) | (iv[k].to_dict() if k in iv else {}) for k, s in (("baseline", self.baseline), ("best", self.best)))
        return {"baseline": base, "best": best, "predicted_speedup": self.speedup,
                "predicted_gain_pct": self.gain_pct, "worth_applying": self.worth_applying, "candidates_replayed": self.replayed,
                "search_seconds": self.seconds, "seeds": [self.describe(s) for s in self.seeds], "notes": self.notes,
                "memory_reason": self.memory_reason, "summary": st.summary(), "caveats": st.caveats()}


def _layer_names(o: GradientOrder, a: int, z: int, names: list[str]) -> tuple[str, ...]:
    seen: list[str] = []
    for lay in o.layer[a : z + 1].tolist():
        if names[lay] not in seen:
            seen.append(names[lay])
    return tuple(seen)


class _Template:
    """One graph structure (micro-batch count) with its slots and an incremental replayer.

    With an overlap slowdown, compute durations are kept undisturbed (the profiled overlap's share
    taken out once) and each candidate is replayed twice: once to see its overlap, once charged for it.
    """

    def __init__(self, g: Graph, order: GradientOrder, costs: CodecCosts | None, accumulate: int, recompute: bool,
                 cand_segments: list[Segment], slowdown: float = 0.0):
        self.k = accumulate
        self.slowdown = slowdown
        g = accumulate_gradients(g, accumulate)
        self.rslots = RecomputeSlots(g, cand_segments) if recompute else None
        self.bslots = BucketSlots(self.rslots.graph if self.rslots else g, order, costs)
        self.graph = self.bslots.graph
        self.rec_ids = np.concatenate([self.bslots.remap[n] for n in self.rslots.nodes]) if self.rslots and self.rslots.nodes else None  # ids in our graph
        self.slot_of_comm = {int(v): i for i in range(self.bslots.comm.shape[1]) for v in self.bslots.comm[:, i]}
        self.replayer: IncrementalReplayer | None = None
        self.slowed = slowed_nodes(self.graph)
        self.base_dur = self.graph.dur
        if slowdown > 0:  # undisturbed durations: the profiled layout's own overlap taken out
            profiled = self._columns(Candidate(order.profiled_ends), self.graph.dur)
            self.base_dur = undisturbed(profiled, replay(profiled), slowdown)

    def _columns(self, c: Candidate, dur: np.ndarray) -> Graph:
        ids, sdur, gap, nb = self.bslots.columns(c.plan)
        d, gp, n = dur.copy(), self.graph.gap.copy(), self.graph.nbytes.copy()
        d[ids], gp[ids], n[ids] = sdur, gap, nb
        if self.rec_ids is not None:
            d[self.rec_ids] = self.rslots.columns(c.recompute)[1]
        return self.graph.replace(dur=d, gap=gp, nbytes=n)

    def _run(self, g: Graph) -> ReplayResult:
        if self.replayer is None:
            if load_kernels() is None:  # no numba: full replays
                return replay(g)
            self.replayer = IncrementalReplayer(g)
            return self.replayer.result
        old = self.replayer.graph
        changed = np.flatnonzero((g.dur != old.dur) | (g.gap != old.gap))
        return self.replayer.update(g, changed, copy=False)

    def replay(self, c: Candidate) -> tuple[Graph, ReplayResult]:
        g = self._columns(c, self.base_dur)
        res = self._run(g)
        if self.slowdown > 0:
            g = g.replace(dur=disturbed(g, g.dur, res, self.slowdown))
            res = self._run(g)
        return g, res


class _Evaluator:
    def __init__(self, g: Graph, order: GradientOrder, costs: CodecCosts | None, opts: Options, cand_segments: list[Segment],
                 memory: MemoryModel | None, recompute: bool = False):
        self.g, self.order, self.costs, self.opts = g, order, costs, opts
        self.recompute = recompute or memory is not None
        self.segments = cand_segments
        self.memory = memory
        self.templates: dict[int, _Template] = {}
        self.cache: dict[Candidate, Scored] = {}
        self.replayed = 0

    def template(self, k: int) -> _Template:
        if k not in self.templates:
            self.templates[k] = _Template(self.g, self.order, self.costs, k, self.recompute, self.segments, self.opts.overlap_slowdown or 0.0)
        return self.templates[k]

    def score(self, c: Candidate, keep: bool = False) -> tuple[Scored, tuple[Graph, ReplayResult] | None]:
        hit = self.cache.get(c)
        if hit is not None and not keep:
            return hit, None
        t = self.template(c.accumulate)
        g, res = t.replay(c)
        self.replayed += 1
        s = Scored(c, job_iteration_us(g, res) / c.accumulate)
        if self.memory is not None:
            largest = float(self.order.bucket_bytes(c.ends).max())
            s.memory = self.memory.peak([self.segments[i] for i in c.recompute], c.codec, c.bucket_view, largest)
            s.fits = self.opts.memory_budget is None or s.memory.total <= self.opts.memory_budget
        self.cache[c] = s
        return s, (g, res)

    def predicted_graph(self, c: Candidate) -> Graph:
        """``c``'s graph as it would run: the template's columns without the slots no bucket uses."""
        t = self.template(c.accumulate)
        return t.bslots.compact(t.replay(c)[0], c.plan)

    def objective(self, s: Scored) -> float:
        if s.fits or s.memory is None:
            return s.iter_us
        return s.iter_us * (1.0 + 10.0 * (s.memory.total / self.opts.memory_budget - 1.0))


def search(g: Graph, order: GradientOrder, opts: Options | None = None, costs: CodecCosts | None = None,
           layer_saved_bytes: dict[str, int] | None = None) -> SearchResult:
    """The best strategy for the run behind ``g`` (see the module docstring)."""
    opts = opts or Options()
    t0 = time.perf_counter()
    rng = random.Random(opts.seed)
    measured, g = g, set_topology(g, current_topology(g))  # one link model, fitted on every rank's collectives, before any folding
    notes = ["comm scheduling (bucket priority) not searched: DDP issues buckets in gradient-ready order and its optimizer "
             "waits for every bucket, so no order of the channel changes the iteration"]
    codecs = [Codec()]
    if opts.allow_lossy:
        if costs is None:
            raise DagprofError("--allow-lossy needs the measured codec costs")
        codecs += [Codec("fp16"), Codec("bf16")] + [Codec("powersgd", r) for r in opts.powersgd_ranks]
    memory = None
    cand_segments: list[Segment] = []
    if opts.memory_budget is not None:
        memory = MemoryModel.from_profile(g, order, layer_saved_bytes or {}, opts.optimizer_state)
        cand_segments = segments(g)
    if opts.overlap_slowdown:
        notes.append(f"compute beside in-flight collectives modelled {opts.overlap_slowdown:.2f}x slower per unit of overlap "
                     "(measured on the job's ranks)")
    symmetric, folded_note = _fold(g, opts)
    if folded_note:
        notes.append(folded_note)
    ev = _Evaluator(symmetric, order, costs, opts, cand_segments, memory)
    full = ev if symmetric is g else _Evaluator(g, order, costs, opts, cand_segments, memory)
    allowed = np.union1d(order.boundaries(), np.asarray(order.profiled_ends, dtype=np.int64))
    accs = sorted({1, opts.accumulate})
    baseline_c = Candidate(order.profiled_ends)
    recompute0, view0, reason = _fit_memory(memory, opts, cand_segments, ev, order)

    def report(best: float, base: float) -> None:
        if opts.progress is not None:
            opts.progress(Progress(ev.replayed + (full.replayed if full is not ev else 0), time.perf_counter() - t0, opts.budget_s,
                                   best / 1e3, base / 1e3))

    # seeds
    layouts = {order.profiled_ends, tuple(allowed.tolist()), (len(order) - 1,)}
    for cap in SEED_CAPS_MB:
        for first in (None, MB):
            layouts.add(_snap(order.layout_from_caps(cap * MB, first), allowed))
    seeds = []
    for k in accs:
        for codec in codecs:
            for ends in sorted(layouts):
                seeds.append(Candidate(ends, codec, 1, recompute0, k, view0))
    scored = []
    base_score, _ = ev.score(replace(baseline_c, recompute=frozenset(), bucket_view=False))
    for c in seeds:
        if time.perf_counter() - t0 > opts.budget_s * 0.5 and scored:
            break
        scored.append(ev.score(c)[0])
        report(min(ev.objective(s) for s in scored), base_score.iter_us)
    cur = min(scored, key=ev.objective)
    best = cur
    temp = 0.02 * cur.iter_us
    cur_path = _hot(ev, cur)
    stale = 0
    proposals = 0
    while (time.perf_counter() - t0 < opts.budget_s and proposals < opts.max_candidates and stale < opts.patience):
        proposals += 1
        c = _propose(rng, cur.candidate, cur_path, allowed, codecs, len(cand_segments), cand_segments, order)
        if c == cur.candidate:
            stale += 1
            continue
        s, _ = ev.score(c)
        delta = ev.objective(s) - ev.objective(cur)
        if delta < 0 or rng.random() < math.exp(-delta / max(temp, 1e-9)):
            cur = s
            cur_path = _hot(ev, cur)
        if ev.objective(s) < ev.objective(best) - 1e-6:
            best, stale = s, 0
        else:
            stale += 1
        temp *= 0.995
        if proposals % 25 == 0:
            report(ev.objective(best), base_score.iter_us)
    # the reported prediction: the full graph, for the baseline and the best few distinct candidates
    finalists = sorted({s.candidate: s for s in ev.cache.values()}.values(), key=ev.objective)[:FINAL_CHECK]
    final = [full.score(s.candidate)[0] if full is not ev else s for s in finalists]
    best_full = min(final, key=full.objective)
    near = [s for s in final if full.objective(s) <= full.objective(best_full) * (1 + TIE_PCT / 100)]
    best_full = min(near, key=lambda s: (_complexity(s.candidate), full.objective(s)))  # within noise, the simpler one
    base_full = full.score(replace(baseline_c, recompute=frozenset(), bucket_view=False))[0]
    if memory is not None and base_full.memory is None:
        base_full.memory = memory.peak([], Codec(), False, float(order.bucket_bytes(baseline_c.ends).max()))
        base_full.fits = opts.memory_budget is None or base_full.memory.total <= opts.memory_budget
    if full.objective(base_full) <= full.objective(best_full) * (1 + TIE_PCT / 100):
        best_full = base_full  # nothing beats the profiled setup by more than a tie: it is the simplest of all
    if not best_full.fits:
        reason = reason or "no candidate found fits the memory budget"
    report(best_full.iter_us, base_full.iter_us)
    residuals = link_residuals(measured, g)
    intervals = {}
    for name, s in (("baseline", base_full), ("best", best_full)):
        sg, res = full.score(s.candidate, keep=True)[1]
        intervals[name] = predict_interval(sg, res, s.iter_us * s.candidate.accumulate, residuals).scaled(1 / s.candidate.accumulate)
    seeds_out = sorted({s.candidate: s for s in scored if s.candidate.codec.name == "none" and s.candidate.accumulate == 1}.values(),
                       key=lambda s: len(s.candidate.ends))
    return SearchResult(base_full, best_full, order, cand_segments, ev.replayed + (full.replayed if full is not ev else 0),
                        time.perf_counter() - t0, graph_world_size(g), seeds_out, notes, list(g.layers), opts.overlap_slowdown or 0.0, reason,
                        intervals)


def _complexity(c: Candidate) -> tuple:
    """Fewer moving parts first: no partition, no recomputation, lossless, fewer buckets."""
    return (c.parts > 1, len(c.recompute), c.codec.name != "none", len(c.ends))


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


def _snap(ends: tuple[int, ...], allowed: np.ndarray) -> tuple[int, ...]:
    """Bucket ends moved to the nearest allowed boundary at or after them (layer ends), deduplicated."""
    idx = np.searchsorted(allowed, np.asarray(ends), side="left")
    snapped = allowed[np.minimum(idx, len(allowed) - 1)]
    return tuple(sorted(set(snapped.tolist())))


def _hot(ev: _Evaluator, s: Scored) -> dict[str, list[int]]:
    """Buckets on the critical path of ``s``'s replay: "late" (waited for their gradients) and "busy"
    (waited for the channel)."""
    t = ev.template(s.candidate.accumulate)
    g, res = t.replay(s.candidate)
    ev.replayed += 1
    path = critical_path(g, res, top=1).nodes
    late, busy = [], []
    for v in path.tolist():
        i = t.slot_of_comm.get(int(v))
        if i is None:
            continue
        gate = int(res.gate[v])
        (busy if gate in t.slot_of_comm else late).append(i)
    return {"late": sorted(set(late)), "busy": sorted(set(busy))}


def _propose(rng: random.Random, c: Candidate, hot: dict[str, list[int]], allowed: np.ndarray, codecs: list[Codec],
             n_segments: int, cand_segments: list[Segment], order: GradientOrder) -> Candidate:
    ends = list(c.ends)
    r = rng.random()
    if r < 0.5 and (hot["late"] or hot["busy"]):  # critical-path guided
        if hot["late"] and (not hot["busy"] or rng.random() < 0.6):
            end = rng.choice(hot["late"])  # this bucket became ready too late: split it
            k = ends.index(end) if end in ends else None
            lo = ends[k - 1] if k else -1
            inside = allowed[(allowed > lo) & (allowed < end)]
            if len(inside):
                cum = np.cumsum(order.nbytes)
                half = (cum[lo] if lo >= 0 else 0) + (cum[end] - (cum[lo] if lo >= 0 else 0)) * rng.uniform(0.2, 0.8)
                split = int(inside[np.argmin(np.abs(cum[inside] - half))])
                return replace(c, ends=tuple(sorted(ends + [split])))
        end = rng.choice(hot["busy"] or hot["late"])  # behind a busy channel: fewer collectives, or fewer bytes
        if len(codecs) > 1 and rng.random() < 0.3:
            return replace(c, codec=rng.choice(codecs))
        k = ends.index(end) if end in ends else -1
        if k > 0:
            return replace(c, ends=tuple(e for e in ends if e != ends[k - 1]))
        return c
    if r < 0.62 and len(ends) > 1:  # move a boundary to a neighbouring layer end
        k = rng.randrange(len(ends) - 1)
        pos = int(np.searchsorted(allowed, ends[k]))
        new = allowed[min(max(pos + rng.choice((-2, -1, 1, 2)), 0), len(allowed) - 1)]
        lo = ends[k - 1] if k else -1
        if lo < new < ends[k + 1]:
            ends[k] = int(new)
            return replace(c, ends=tuple(ends))
        return c
    if r < 0.72 and len(ends) > 1:  # merge two buckets
        ends.pop(rng.randrange(len(ends) - 1))
        return replace(c, ends=tuple(ends))
    if r < 0.82:  # split a bucket
        new = int(rng.choice(allowed.tolist()))
        return replace(c, ends=tuple(sorted(set(ends) | {new})))
    if r < 0.9 and len(codecs) > 1:
        return replace(c, codec=rng.choice(codecs))
    if r < 0.95:
        return replace(c, parts=rng.choice(PARTS))
    if n_segments:
        i = rng.randrange(n_segments)
        chosen = set(c.recompute)
        if i in chosen:
            chosen.discard(i)
        else:  # recomputing a module and one inside it recomputes twice: keep the outer one
            chosen = {j for j in chosen if not (cand_segments[i].contains(cand_segments[j]) or cand_segments[j].contains(cand_segments[i]))}
            chosen.add(i)
        return replace(c, recompute=frozenset(chosen))
    return c


def _fit_memory(memory: MemoryModel | None, opts: Options, cand_segments: list[Segment], ev: _Evaluator,
                order: GradientOrder) -> tuple[frozenset[int], bool, str | None]:
    """A starting point that fits the memory budget: gradients as bucket views, then modules recomputed
    greedily by bytes freed per microsecond of recomputation; the reason when even all of it does not fit."""
    if memory is None or opts.memory_budget is None:
        return frozenset(), False, None
    budget = opts.memory_budget
    largest = float(order.bucket_bytes(order.profiled_ends).max())
    if memory.peak([], Codec(), False, largest).total <= budget:
        return frozenset(), False, None
    if memory.peak([], Codec(), True, largest).total <= budget:
        return frozenset(), True, None
    t = ev.template(1)
    cost = [float(c.sum()) + 1.0 for c in t.rslots.cost]
    ranked = sorted(range(len(cand_segments)), key=lambda i: -memory.freed(cand_segments[i]) / cost[i])
    chosen: list[int] = []
    for i in ranked:
        if any(cand_segments[i].contains(cand_segments[j]) or cand_segments[j].contains(cand_segments[i]) for j in chosen):
            continue
        if memory.freed(cand_segments[i]) <= 0:
            continue
        chosen.append(i)
        if memory.peak([cand_segments[j] for j in chosen], Codec(), True, largest).total <= budget:
            return frozenset(chosen), True, None
    levels = [[i for i, sg in enumerate(cand_segments) if sg.module.count(".") == d] for d in sorted({sg.module.count(".") for sg in cand_segments})]
    fitting = [lv for lv in levels if memory.peak([cand_segments[i] for i in lv], Codec(), True, largest).total <= budget]
    if fitting:  # a whole nesting level fits where the greedy pick did not: the cheapest to recompute
        return frozenset(min(fitting, key=lambda lv: sum(cost[i] for i in lv))), True, None
    least = _least_memory(memory, cand_segments, largest)
    fixed = memory.grad_bytes * (2 + memory.optimizer_state)
    mb = lambda x: f"{x / MB:.0f} MB"  # noqa: E731
    reason = (f"no strategy fits {mb(budget)} per rank: the least dagprof can reach is {mb(least)} (parameters, gradients and optimizer "
              f"state {mb(fixed)}, activations {mb(least - fixed)} with modules recomputed and gradients as bucket views)")
    return frozenset(chosen), True, reason


def _least_memory(memory: MemoryModel, cand_segments: list[Segment], largest: float) -> float:
    """The lowest peak over recomputing all modules of one nesting depth (they never contain each other):
    outer modules free more but rematerialise more during their own backward, inner ones the reverse."""
    best = memory.peak([], Codec(), True, largest).total
    for depth in sorted({s.module.count(".") for s in cand_segments}):
        level = [s for s in cand_segments if s.module.count(".") == depth]
        best = min(best, memory.peak(level, Codec(), True, largest).total)
    return best


def search_run(run: Run, g: Graph, opts: Options | None = None, costs_file: str | None = None) -> SearchResult:
    """``search`` on a loaded dagprof run: its DDP bucket layout and activation sizes come from rank 0's
    profile; with ``allow_lossy`` the codec costs are measured on this machine (kept in ``costs_file``)."""
    opts = opts or Options()
    if g.meta.fsdp is not None:
        raise DagprofError("this profile is an FSDP job; dagprof optimize searches DDP strategies only (FSDP's reshard, "
                           "prefetch and unit grouping are not modelled yet)", run.source)
    if not ((g.kind == Kind.COMM) & (g.bucket >= 0)).any():
        raise DagprofError("the trace has no gradient-bucket all-reduce to re-bucket (a dagprof profile of a DDP job has them)", run.source)
    meta = run.ranks[0].meta
    layouts = meta.bucket_layouts
    order = gradient_order(g, layouts[-1] if layouts else [])
    costs = _in_job(_codec_costs(order, opts, costs_file), run) if opts.allow_lossy else None
    if opts.overlap_slowdown is None:
        opts = replace(opts, overlap_slowdown=_slowdown_of(run))
    return search(g, order, opts, costs, meta.layer_saved_bytes)


def _measured(run: Run) -> dict:
    return (load_overlap(run.source) if run.source and os.path.isdir(run.source) else None) or {}


def _slowdown_of(run: Run) -> float:
    """The compute slowdown measured beside collectives for this run (``collect.overlap``), else 0."""
    return float(_measured(run).get("slowdown", 0.0))


def _in_job(costs: CodecCosts | None, run: Run) -> CodecCosts | None:
    """Codec costs as they run inside the job: scaled by how much slower the job's busy cores ran the
    reference op than the idle core that measured the codecs (never faster)."""
    job = _measured(run).get("matmul_us")
    if costs is None or not job or not costs.reference_op_us:
        return costs
    return costs.scaled(max(1.0, float(job) / costs.reference_op_us))


def _codec_costs(order: GradientOrder, opts: Options, path: str | None) -> CodecCosts:
    """Measured once per machine and model (``path`` keeps them), re-measured when something is missing."""
    shaped = [(p, s) for p, s in zip(order.params, order.shapes) if s is not None]
    if path and os.path.exists(path):
        costs = CodecCosts.load(path)
        have = all(r in costs.powersgd and all(p in costs.powersgd[r] or not powersgd_split(s, r)[1] for p, s in shaped)
                   for r in opts.powersgd_ranks)
        if have and {"fp16", "bf16"} <= set(costs.encode_us_per_byte):
            return costs
    from ..collect.codec_costs import measure_codec_costs

    costs = measure_codec_costs(shaped, tuple(opts.powersgd_ranks))
    if path:
        costs.save(path)
    return costs


@dataclass
class Priced:
    """A strategy priced on one profile, with the graph predicted for it (what
    ``analysis.diff.categories_vs_expected`` holds a profile of the strategy run against)."""

    prediction: Prediction
    graph: Graph


def predict_run(run: Run, g: Graph, strategy: Strategy, costs_file: str | None = None, measured_in: Run | None = None) -> Priced:
    """``strategy`` priced on this run: how a strategy found on one profile is priced on another (a later
    profile of the same job, e.g. each verification round's). ``measured_in``: the run whose overlap
    measurements (slowdown, codec yardstick) apply, default ``run``."""
    like = measured_in or run
    layouts = run.ranks[0].meta.bucket_layouts
    order = gradient_order(g, layouts[-1] if layouts else [])
    c = strategy.compression
    codec = c.as_codec
    costs = _codec_costs(order, Options(allow_lossy=True, powersgd_ranks=(c.rank,) if c.codec == "powersgd" else ()), costs_file) if c.lossy else None
    costs = _in_job(costs, like)
    segs = segments(g) if strategy.recompute else []
    ev = _Evaluator(g, order, costs, Options(overlap_slowdown=_slowdown_of(like)), segs, None, recompute=bool(strategy.recompute))
    index = {p: i for i, p in enumerate(order.params)}
    if strategy.buckets is None:
        ends = order.profiled_ends
    else:
        missing = [p for b in strategy.buckets for p in b.params if p not in index]
        if missing:
            raise DagprofError(f"strategy does not match this run: parameter {missing[0]!r} is not in its DDP buckets")
        ends = tuple(sorted(index[b.params[-1]] for b in strategy.buckets))
    rec = frozenset(i for i, sg in enumerate(segs) if sg.module in strategy.recompute)
    cand = Candidate(ends, codec, strategy.partition, rec, strategy.accumulate, strategy.grad_as_bucket_view)
    base = ev.score(Candidate(order.profiled_ends))[0]
    return Priced(Prediction(base.iter_us / 1e3, ev.score(cand)[0].iter_us / 1e3), ev.predicted_graph(cand))
