"""Pricing candidates by replay: each candidate only changes slot durations of one graph per micro-batch count.

The passes that price a candidate's knobs (``search.candidate.KNOBS``) insert their slots once per
template: gradient accumulation (a graph per micro-batch count), recomputation slots, bucket slots
(layout, codec and partition); a candidate then fills the slots' columns and is replayed
incrementally (``IncrementalReplayer``). Its memory is estimated by ``search.memory``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis.interval import typical_iteration_us
from ..costmodel.codecs import CodecCosts
from ..graph.dag import Graph
from ..passes.accumulate import accumulate_gradients
from ..passes.bucket_plan import BucketSlots
from ..passes.compression import UNMEASURED, Chained
from ..passes.gradients import GradientOrder
from ..passes.overlap import comm_demand, disturbed, slowed_nodes, undisturbed
from ..passes.recompute import RecomputeSlots, Segment
from ..replay import ReplayResult, replay
from ..replay.incremental import IncrementalReplayer
from ..replay.numba_engine import load_kernels
from .candidate import Candidate
from .memory import MemoryBreakdown, MemoryModel


@dataclass
class Scored:
    candidate: Candidate
    iter_us: float  # per micro-batch: the median step (``analysis.interval.typical_iteration_us``)
    memory: MemoryBreakdown | None = None
    fits: bool = True


class Template:
    """One graph structure (micro-batch count) with its slots and an incremental replayer.

    With an overlap slowdown, compute durations are kept undisturbed (the profiled overlap's share
    taken out once) and each candidate is replayed twice: once to see its overlap, once charged for it.
    ``comm_rate``: bytes per second of the all-reduce the slowdown was measured beside; each collective then
    slows compute in proportion to the bytes it moves per second (``passes.overlap.comm_demand``). ``chained``: the job's
    small all-reduces chained by completion callbacks (``passes.compression.Chained``), which PowerSGD's three pay.
    """

    def __init__(self, g: Graph, order: GradientOrder, costs: CodecCosts | None, accumulate: int, recompute: bool,
                 cand_segments: list[Segment], slowdown: float = 0.0, comm_rate: float | None = None, chained: Chained = UNMEASURED):
        self.k = accumulate
        self.slowdown, self.comm_rate = slowdown, comm_rate
        g = accumulate_gradients(g, accumulate)
        self.rslots = RecomputeSlots(g, cand_segments) if recompute else None
        self.bslots = BucketSlots(self.rslots.graph if self.rslots else g, order, costs, slowdown, chained)
        self.graph = self.bslots.graph
        self.rec_ids = np.concatenate([self.bslots.remap[n] for n in self.rslots.nodes]) if self.rslots and self.rslots.nodes else None  # ids in our graph
        self.slot_of_comm = {int(v): i for i in range(self.bslots.comm.shape[1]) for v in self.bslots.comm[:, i]}
        self.replayer: IncrementalReplayer | None = None
        self.slowed = slowed_nodes(self.graph)
        self.base_dur = self.graph.dur
        if slowdown > 0:  # undisturbed durations: the profiled layout's own overlap taken out
            c0 = Candidate(order.profiled_ends)
            profiled = self._columns(c0, self.graph.dur)
            res = replay(profiled)
            self.base_dur = undisturbed(profiled, res, slowdown, self._demand(c0, profiled, res))

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

    def _demand(self, c: Candidate, g: Graph, res: ReplayResult) -> np.ndarray | None:
        """Each collective's share of the measured all-reduce's CPU (None: no rate measured, each counts whole)."""
        if self.comm_rate is None:
            return None
        wire = g.nbytes.astype(np.float64)
        if c.codec.name != "none":  # the slots carry the bucket's own bytes; a codec sends fewer
            ends = np.asarray(c.plan.ends, dtype=np.int64)
            wire[self.bslots.comm[:, ends]] = [b.wire_bytes for b in self.bslots.costs_of(c.plan)]
        return comm_demand(g, res, wire, self.comm_rate)

    def replay(self, c: Candidate) -> tuple[Graph, ReplayResult]:
        g = self._columns(c, self.base_dur)
        res = self._run(g)
        if self.slowdown > 0:
            g = g.replace(dur=disturbed(g, g.dur, res, self.slowdown, self._demand(c, g, res)))
            res = self._run(g)
        return g, res


class Evaluator:
    """Candidates scored on one graph (cached), with their memory when a memory model is given;
    ``memory_budget`` (bytes per rank) makes a candidate that does not fit score worse."""

    def __init__(self, g: Graph, order: GradientOrder, costs: CodecCosts | None, cand_segments: list[Segment],
                 memory: MemoryModel | None, slowdown: float = 0.0, memory_budget: float | None = None, recompute: bool = False,
                 comm_rate: float | None = None, chained: Chained = UNMEASURED):
        self.g, self.order, self.costs, self.chained = g, order, costs, chained
        self.slowdown, self.memory_budget, self.comm_rate = slowdown, memory_budget, comm_rate
        self.recompute = recompute or memory is not None
        self.segments = cand_segments
        self.memory = memory
        self.templates: dict[int, Template] = {}
        self.cache: dict[Candidate, Scored] = {}
        self.replayed = 0

    def template(self, k: int) -> Template:
        if k not in self.templates:
            self.templates[k] = Template(self.g, self.order, self.costs, k, self.recompute, self.segments, self.slowdown, self.comm_rate,
                                          self.chained)
        return self.templates[k]

    def score(self, c: Candidate, keep: bool = False) -> tuple[Scored, tuple[Graph, ReplayResult] | None]:
        hit = self.cache.get(c)
        if hit is not None and not keep:
            return hit, None
        t = self.template(c.accumulate)
        g, res = t.replay(c)
        self.replayed += 1
        s = Scored(c, typical_iteration_us(g, res) / c.accumulate)
        if self.memory is not None:
            largest = float(self.order.bucket_bytes(c.ends).max())
            s.memory = self.memory.peak([self.segments[i] for i in c.recompute], c.codec, c.bucket_view, largest)
            s.fits = self.memory_budget is None or s.memory.total <= self.memory_budget
        self.cache[c] = s
        return s, (g, res)

    def predicted_graph(self, c: Candidate) -> Graph:
        """``c``'s graph as it would run: the template's columns without the slots no bucket uses."""
        t = self.template(c.accumulate)
        return t.bslots.compact(t.replay(c)[0], c.plan)

    def objective(self, s: Scored) -> float:
        return s.iter_us if s.memory is None else penalised(s.iter_us, s.memory.total, self.memory_budget)


def penalised(iter_us: float, peak: float, budget: float | None) -> float:
    """What the search minimises: the step time, made worse in proportion to how far the peak memory passes the budget."""
    if budget is None or peak <= budget:
        return iter_us
    return iter_us * (1.0 + 10.0 * (peak / budget - 1.0))
