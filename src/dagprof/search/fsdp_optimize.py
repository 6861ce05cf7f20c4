"""Search FSDP2 strategies by replay: each unit's ``reshard_after_forward`` and the reduce dtype, under a memory budget.

A candidate is, for every unit (the root's too: ``fully_shard(model)`` keeps it gathered, an explicit
``reshard_after_forward=True`` does not), whether it reshards after forward, and the dtype gradients are reduced in
(only with ``--allow-lossy``: bf16 rounds what the optimizer sees). Each candidate is priced on the run's
own graph by the FSDP what-if passes (``passes.fsdp.set_reshard`` per unit, ``set_reduce_dtype``) with the
link model fitted to the run's collectives, and its peak memory per rank by ``search.fsdp_memory.fsdp_peak``;
under ``--memory-budget`` a candidate that does not fit scores worse (``evaluate.penalised``), and a
budget that not even the least memory candidate fits is refused in one line.

On a job of several ``fully_shard`` roots (a GAN, an actor-critic, a student beside its EMA teacher) each unit's reshard is
its own root's (the what-ifs re-lay units within their root), the peak is the phase model's (``fsdp_memory.root_phases``:
each root's activations while the profile had them alive), groupings stay within a root, and the space is searched root
by root (``_root_by_root``); the strategy names each unit's root, and ``dagprof.apply`` takes every root.

How it searches: the space is 2^units x dtypes. Up to ``EXHAUSTIVE`` candidates every one is replayed
(a small job's space: a 4-block model has 16 x 2); beyond that, from the best of the seeds (as profiled,
every unit resharded, every unit kept, each dtype), the best single change (one unit flipped, or the
dtype) is taken while one gains, within ``--budget`` seconds. Deterministic: no randomness is needed.

Unit grouping (which modules ``fully_shard`` wraps together) is searched too, but as advice: it is set at wrap time,
so ``apply`` cannot change it on a wrapped model and the strategy file does not carry it. Each coarser grouping of the
profiled setup (``passes.fsdp_units``: every adjacent pair, every ``merge:N``, ``merge:all``) is priced on the run's
graph with every collective priced by the link model, as a ratio to the same graph ungrouped (so the model's own
error on the profiled run cancels), applied to the measured profiled iteration; with its peak memory per rank.
The best one that gains at least ``WORTH_APPLYING_PCT`` and fits the budget is advised with its ``fully_shard`` call.

Not searched, and said in the output: prefetch depth (``passes.fsdp.PREFETCH_ON_GLOO``: on CPU/gloo each all-gather
blocks the thread that issues it, one in flight whatever the depth, and depth 1 and 2 measured within the rounds' spread
of depth 0). DDP's knobs have no FSDP meaning.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import ClassVar

from ..analysis import job_iteration_us
from ..analysis.interval import PredictionInterval, StepStatistic, link_residuals, predict_interval
from ..collect.deploy.strategy import FsdpPlan, FsdpUnitPlan, Prediction, Strategy
from ..errors import DagprofError
from ..graph.build_fsdp import refuse_replicated_by_fsdp, refuse_untimed_roots
from ..graph.dag import Graph
from ..passes.comm import current_topology, set_topology
from ..passes.fsdp import reshard_change, resharded, set_reduce_dtype, set_reshard
from ..passes.fsdp_units import merge_units, unit_groups, with_units
from ..passes.link_fit import graph_world_size
from ..replay import ReplayResult, replay
from ..traces.kineto_schema import dtype_bytes
from ..traces.run_schema import FSDP1_API, FSDP2_API, FSDP_ROOT
from ..units import MB
from .evaluate import penalised
from .fsdp_memory import GATHERED_UNRECORDED, FsdpMemory, fsdp_peak, offload_note
from .memory import autograd_host
from .optimize import TIE_PCT, WORTH_APPLYING_PCT, Gain

EXHAUSTIVE = 4096  # candidates replayed one by one; beyond this, seeds then the best single change
LOSSY_DTYPES = ("bfloat16",)  # float16 moves the same bytes: it would price the same
# the measurement behind it is in passes.fsdp.PREFETCH_ON_GLOO, which `whatif --prefetch` prints in its refusal
NOT_SEARCHED = ("prefetch depth not searched: on CPU/gloo it does not change a step (each all-gather blocks the thread that issues "
                "it, one in flight at any depth; whatif --prefetch 2 says what was measured)",)


@dataclass(frozen=True)
class FsdpCandidate:
    reshard: tuple[bool, ...]  # per unit, in the record's order
    reduce_dtype: str | None = None  # None: as profiled


@dataclass
class FsdpScored:
    candidate: FsdpCandidate
    iter_us: float
    memory: FsdpMemory  # the rank with the highest peak
    fits: bool = True


class FsdpEvaluator:
    """Candidates priced on one FSDP graph (cached).

    The collectives keep their measured times (a reshard removes or repeats measured all-gathers), so the
    profiled setup replays as measured. A lower reduce dtype needs the link model (``set_reduce_dtype``
    reprices every collective); its effect is taken as the ratio of two replays under that model, with
    and without the dtype, applied to the candidate's replay on measured times."""

    def __init__(self, g: Graph, units: list[str], memory_budget: float | None):
        self.g, self.units, self.memory_budget = g, units, memory_budget
        self.cache: dict[FsdpCandidate, FsdpScored] = {}
        self.replayed = 0
        self._modelled: Graph | None = None

    @property
    def modelled(self) -> Graph:
        """The graph with every collective priced by the link fitted to the run's collectives."""
        if self._modelled is None:
            self._modelled = set_topology(self.g, current_topology(self.g))
        return self._modelled

    def mapping(self, c: FsdpCandidate) -> dict[str, bool]:
        return dict(zip(self.units, c.reshard))

    def graph(self, c: FsdpCandidate) -> Graph:
        """The candidate's graph as it would run (a lower reduce dtype: every collective priced by the link model)."""
        g = self.g if c.reduce_dtype is None else set_reduce_dtype(self.modelled, c.reduce_dtype)
        return set_reshard(g, self.mapping(c))

    def replay(self, c: FsdpCandidate) -> tuple[Graph, ReplayResult]:
        g = self.graph(c)
        return g, replay(g)

    def _iter_us(self, c: FsdpCandidate) -> float:
        g = set_reshard(self.g, self.mapping(c))
        us = job_iteration_us(g, replay(g))
        if c.reduce_dtype is not None:
            same = set_reshard(self.modelled, self.mapping(c))
            us *= job_iteration_us(*self.replay(c)) / job_iteration_us(same, replay(same))
        return us

    def score(self, c: FsdpCandidate) -> FsdpScored:
        hit = self.cache.get(c)
        if hit is not None:
            return hit
        self.replayed += 1
        dtyped = self.g if c.reduce_dtype is None else set_reduce_dtype(self.g, c.reduce_dtype)  # the memory model reads the dtypes
        mem = max(fsdp_peak(dtyped, reshard=self.mapping(c)).values(), key=lambda m: m.total)
        s = FsdpScored(c, self._iter_us(c), mem, self.memory_budget is None or mem.total <= self.memory_budget)
        self.cache[c] = s
        return s

    def objective(self, s: FsdpScored) -> float:
        return penalised(s.iter_us, s.memory.total, self.memory_budget)


def _root_name(k: int) -> str:
    """The name ``Grouping.wrap`` gives the ``fully_shard`` root ``k`` (``FsdpGraphUnit.root``) in its advice."""
    return f"root{k}" if k else "model"


def _path_in_root(unit: str, k: int) -> str:
    """A unit's module path inside root ``k``: another root's unit names begin with that root's prefix."""
    return unit.partition(".")[2] if k else unit


@dataclass(frozen=True)
class Grouping:
    """A coarser unit grouping of the profiled setup (``passes.fsdp_units`` spec), priced; wrap-time advice."""

    spec: str  # "blocks.0+blocks.1", "merge:2", "merge:all"
    groups: tuple[tuple[str, ...], ...]  # the merged groups (two units or more), in forward order
    iter_us: float
    memory: FsdpMemory
    fits: bool
    roots: tuple[int, ...] = ()  # each group's fully_shard root (``FsdpGraphUnit.root``; empty: the first's)
    root_units: frozenset[str] = frozenset({FSDP_ROOT})  # the roots' own units (``FsdpGraphUnit.is_root``)

    def wrap(self, api: str) -> str:
        """How to make the groups: FSDP2's ``fully_shard`` calls (``model.`` before each module path; ``rootK.`` in the
        K-th other root a job of several roots attached), the root's last; FSDP1 wraps one module per unit, so each group
        needs a module that holds just its members."""
        if api != FSDP2_API:
            return "; ".join(f"FullyShardedDataParallel(model) alone, with {', '.join(grp[1:])} not wrapped" if FSDP_ROOT in grp
                             else f"one FullyShardedDataParallel unit for {' + '.join(grp)}" for grp in self.groups)
        roots = self.roots or (0,) * len(self.groups)
        calls = [f"fully_shard([{', '.join(f'{_root_name(k)}.{_path_in_root(n, k)}' for n in grp)}])" for grp, k in zip(self.groups, roots)
                 if not self.root_units & set(grp)]
        calls += [f"fully_shard({_root_name(k)}) with {', '.join(_path_in_root(n, k) for n in grp if n not in self.root_units)} "
                  "not wrapped on their own"
                  for grp, k in zip(self.groups, roots) if self.root_units & set(grp)]
        prefix = {k: grp[0].partition(".")[0] for grp, k in zip(self.groups, roots) if k}
        named = "; ".join(f"root{k}: the fully_shard root whose unit names begin {p}" for k, p in sorted(prefix.items()))
        return "; ".join(calls) + (f" ({named})" if named else "")

    def to_dict(self, baseline_us: float, api: str) -> dict:
        return {"units": self.spec, "groups": [list(grp) for grp in self.groups], "wrap": self.wrap(api),
                "predicted_iter_ms": self.iter_us / 1e3, "gain_pct": 100.0 * (baseline_us - self.iter_us) / baseline_us,
                "memory": self.memory.to_dict(), "fits_memory": self.fits}


@dataclass
class FsdpSearchResult(Gain):
    step_statistic: ClassVar[StepStatistic] = StepStatistic.MEAN  # ``job_iteration_us`` (``FsdpEvaluator``)
    baseline: FsdpScored
    best: FsdpScored
    units: list[str]  # the units, in the record's order
    record_units: list[FsdpUnitPlan]  # every unit as profiled (numel, reshard as it ran)
    profiled_dtype: str
    replayed: int
    seconds: float
    world_size: int
    notes: list[str]
    memory_budget: float | None = None
    intervals: dict[str, PredictionInterval] | None = None
    model_error_pct: float | None = None
    warnings: list[str] = field(default_factory=list)
    memory_reason: str | None = None  # always None: an impossible budget is refused before the search
    groupings: list[Grouping] = field(default_factory=list)  # every grouping priced, fastest first
    api: str = FSDP2_API  # the job's FSDP (how a grouping is made)

    @property
    def grouping(self) -> Grouping | None:
        """The grouping to advise: the fastest that fits the budget and gains at least ``WORTH_APPLYING_PCT``."""
        fit = [gr for gr in self.groupings if gr.fits]
        gain = 100.0 * (self.baseline.iter_us - fit[0].iter_us) / self.baseline.iter_us if fit else 0.0
        return fit[0] if fit and gain >= WORTH_APPLYING_PCT else None

    @property
    def worth_applying(self) -> bool:
        if self.best.candidate == self.baseline.candidate:
            return False
        return (not self.baseline.fits and self.best.fits) or self.gain_pct >= WORTH_APPLYING_PCT

    def plan(self, c: FsdpCandidate) -> FsdpPlan:
        chosen = dict(zip(self.units, c.reshard))
        return FsdpPlan(tuple(FsdpUnitPlan(u.name, u.numel, chosen.get(u.name, u.reshard_after_forward), u.root) for u in self.record_units),
                        c.reduce_dtype)

    def strategy(self) -> Strategy:
        pred = Prediction(self.baseline.iter_us / 1e3, self.best.iter_us / 1e3, self.replayed)
        return Strategy((), self.world_size, prediction=pred, notes=tuple(self.notes), fsdp=self.plan(self.best.candidate))

    def describe(self, s: FsdpScored) -> dict:
        c = s.candidate
        return {"reshard_after_forward": dict(zip(self.units, c.reshard)), "reduce_dtype": c.reduce_dtype or self.profiled_dtype,
                "plan": self.plan(FsdpCandidate(c.reshard)).label(), "predicted_iter_ms": s.iter_us / 1e3, "memory": s.memory.to_dict(), "fits_memory": s.fits}

    def to_dict(self) -> dict:
        st = self.strategy()
        base, best = self.ends()
        return {"fsdp": True, "baseline": base, "best": best, "predicted_speedup": self.speedup, "predicted_gain_pct": self.gain_pct,
                "worth_applying": self.worth_applying, "candidates_replayed": self.replayed, "search_seconds": self.seconds,
                "memory_budget_mb": None if self.memory_budget is None else self.memory_budget / MB, "notes": self.notes,
                "memory_reason": None, "summary": st.summary(), "caveats": st.caveats(), "model_error_pct": self.model_error_pct,
                "warnings": self.warnings, "unit_groupings_priced": len(self.groupings),
                "unit_grouping": None if self.grouping is None else self.grouping.to_dict(self.baseline.iter_us, self.api)}


def search_fsdp(g: Graph, budget_s: float = 30.0, allow_lossy: bool = False, memory_budget: float | None = None,
                source: str | None = None, exhaustive: int = EXHAUSTIVE) -> FsdpSearchResult:
    """The best FSDP strategy for the run behind ``g`` (see the module docstring); every candidate is replayed when
    there are at most ``exhaustive``."""
    t0 = time.perf_counter()
    refuse_untimed_roots(g, "the search of reshard, units and reduce dtype")
    refuse_replicated_by_fsdp(g, "the search of reshard, units and reduce dtype")
    fs = g.meta.fsdp
    if len({tuple(u.mesh) for u in fs.units}) > 1:
        raise DagprofError("this FSDP job's units sit on different meshes; dagprof optimize searches one mesh only", source)
    # reshard_after_forward=N: True would regroup its backward all-gathers; FSDP1's root is never freed after forward
    units = [u.name for u in fs.units if not u.reshard_to and not (fs.api == FSDP1_API and u.name == FSDP_ROOT)]
    profiled_dtype = fs.units[0].reduce_dtype or fs.units[0].orig_dtype
    dtypes: list[str | None] = [None]
    notes = list(NOT_SEARCHED)
    if post := [u for u in fs.units if u.reshard_to]:
        notes.append(f"{', '.join(u.name for u in post)} kept as profiled (reshard_after_forward={post[0].reshard_to}, an int): its reshard "
                     "is not searched, since True would all-gather it in backward on its whole shard group, which is not modelled")
    if allow_lossy:
        dtypes += [d for d in LOSSY_DTYPES if dtype_bytes(d) < dtype_bytes(profiled_dtype)]
    else:
        notes.append(f"reduce dtype kept ({profiled_dtype}): a lower one rounds the gradients; --allow-lossy tries bfloat16")
    if fs.layer_saved_gathered_bytes is None and fs.layer_saved_bytes:
        notes.append(f"peak memory: {GATHERED_UNRECORDED}")
    if note := offload_note(fs):
        notes.append(note)
    if note := autograd_host(g).note:
        notes.append(note)
    ev = FsdpEvaluator(g, units, memory_budget)
    by_name = {u.name: u for u in fs.units}
    profiled = FsdpCandidate(tuple(resharded(by_name[n], None) for n in units))
    if memory_budget is not None:
        _refuse_impossible(ev, units, dtypes, memory_budget, source)
    n = len(units)
    seeds = [profiled] + [FsdpCandidate((on,) * n, d) for d in dtypes for on in (True, False)] + [FsdpCandidate(profiled.reshard, d) for d in dtypes[1:]]
    roots = [[i for i, name in enumerate(units) if by_name[name].root == r] for r in sorted({u.root for u in fs.units})]
    if len(roots) > 1:
        notes.append(f"{len(roots)} fully_shard roots: each root's units searched with the other roots' at their best so far, "
                     "root after root until a round gains nothing; one reduce dtype for every root")
        _root_by_root(ev, min((ev.score(c) for c in seeds), key=ev.objective), roots, dtypes, exhaustive, t0 + budget_s, notes)
    elif 2**n * len(dtypes) <= exhaustive:
        space = seeds + [FsdpCandidate(r, d) for d in dtypes for r in itertools.product((True, False), repeat=n)]
        for c in space:
            if time.perf_counter() - t0 > budget_s and len(ev.cache) >= len(set(seeds)):
                notes.append(f"search stopped at its budget after {len(ev.cache)} of {2**n * len(dtypes)} candidates")
                break
            ev.score(c)
    else:
        cur = min((ev.score(c) for c in seeds), key=ev.objective)
        while time.perf_counter() - t0 < budget_s:
            near = [FsdpCandidate(tuple(not r if i == k else r for i, r in enumerate(cur.candidate.reshard)), cur.candidate.reduce_dtype)
                    for k in range(n)] + [FsdpCandidate(cur.candidate.reshard, d) for d in dtypes if d != cur.candidate.reduce_dtype]
            step = min((ev.score(c) for c in near), key=ev.objective)
            if ev.objective(step) >= ev.objective(cur) - 1e-6:
                break
            cur = step
    base = ev.score(profiled)
    scored = list(ev.cache.values())
    top = min(ev.objective(s) for s in scored)
    near = [s for s in scored if ev.objective(s) <= top * (1 + TIE_PCT / 100)]  # within noise: the fewest changes
    best = min(near, key=lambda s: (_changes(s.candidate, profiled), ev.objective(s)))
    residuals = link_residuals(g, ev.modelled)
    intervals = {}
    for name, s in (("baseline", base), ("best", best)):
        sg, res = ev.replay(s.candidate)
        intervals[name] = predict_interval(sg, res, s.iter_us, residuals)
    record = [FsdpUnitPlan(u.name, u.numel, u.resharded_after_forward, u.root) for u in fs.units]
    groupings = _groupings(ev, base, memory_budget, t0 + budget_s, notes)
    return FsdpSearchResult(base, best, units, record, profiled_dtype, ev.replayed, time.perf_counter() - t0,
                            graph_world_size(g), notes, memory_budget, intervals, groupings=groupings, api=fs.api)


def _root_by_root(ev: FsdpEvaluator, cur: FsdpScored, roots: list[list[int]], dtypes: list[str | None], exhaustive: int,
                  deadline: float, notes: list[str]) -> None:
    """A job of several ``fully_shard`` roots: the space is the product of the roots' own (2^units each), so each root's
    units (and the reduce dtype) are searched with the other roots' held at the best so far (every setting of the root's
    units where at most ``exhaustive``, else each one flipped), root after root, until a round over every root gains
    nothing. A root's reshard changes its own collectives and what its phase holds; each candidate is still replayed and
    its peak taken whole, so what the roots share (the link, the step) is priced, not assumed apart."""
    while True:
        before = ev.objective(cur)
        for idx in roots:
            base = cur.candidate.reshard
            if 2 ** len(idx) * len(dtypes) <= exhaustive:
                settings = list(itertools.product((True, False), repeat=len(idx)))
            else:
                settings = [tuple(not base[i] if i == k else base[i] for i in idx) for k in idx] + [tuple(base[i] for i in idx)]
            for d in dtypes:
                for r in settings:
                    if time.perf_counter() > deadline:
                        notes.append(f"search stopped at its budget after {len(ev.cache)} candidates")
                        return
                    mine = dict(zip(idx, r))
                    s = ev.score(FsdpCandidate(tuple(mine.get(i, on) for i, on in enumerate(base)), d))
                    if ev.objective(s) < ev.objective(cur) - 1e-6:
                        cur = s
        if ev.objective(cur) >= before - 1e-6:
            return


def grouping_specs(g: Graph) -> list[str]:
    """Every coarser grouping searched: each adjacent pair of inner units of one ``fully_shard`` root, ``merge:N`` for
    N = 2 .. (the most inner units of a root - 1), and ``merge:all``; those that make the same groups once."""
    units = g.meta.fsdp.units
    inner = {r: [u.name for u in units if u.root == r and not u.is_root] for r in sorted({u.root for u in units})}
    pairs = [f"{a}+{b}" for names in inner.values() for a, b in zip(names, names[1:])]
    specs = pairs + [f"merge:{k}" for k in range(2, max(map(len, inner.values())))] + ["merge:all"]
    seen, out = set(), []
    for spec in specs:
        key = tuple(tuple(grp) for grp in unit_groups(g, spec))
        if key not in seen and any(len(grp) > 1 for grp in key):
            seen.add(key)
            out.append(spec)
    return out


def _groupings(ev: FsdpEvaluator, base: FsdpScored, memory_budget: float | None, deadline: float, notes: list[str]) -> list[Grouping]:
    """Each grouping of ``grouping_specs`` priced on the profiled setup (module docstring), fastest first."""
    g = ev.g
    specs = grouping_specs(g)
    root_of, root_units = {u.name: u.root for u in g.meta.fsdp.units}, frozenset(u.name for u in g.meta.fsdp.units if u.is_root)
    flat = job_iteration_us(ev.modelled, replay(ev.modelled))
    out, refused = [], 0
    for k, spec in enumerate(specs):
        if time.perf_counter() > deadline and k:
            notes.append(f"unit grouping: search stopped at its budget after {k} of {len(specs)} groupings")
            break
        try:
            merged = merge_units(ev.modelled, spec)  # priced on the profiled graph's link, as ``whatif --units``
        except DagprofError:  # members that reshard differently: not modelled
            refused += 1
            continue
        mem = max(fsdp_peak(with_units(g, spec)).values(), key=lambda m: m.total)
        groups = tuple(tuple(grp) for grp in unit_groups(g, spec) if len(grp) > 1)
        us = base.iter_us * job_iteration_us(merged, replay(merged)) / flat
        out.append(Grouping(spec, groups, us, mem, memory_budget is None or mem.total <= memory_budget,
                            tuple(root_of[grp[0]] for grp in groups), root_units))
    if refused:
        why = ("units given reshard_after_forward=N, an int, or units that reshard after forward differently"
               if any(u.reshard_to for u in g.meta.fsdp.units) else "their units reshard after forward differently")
        notes.append(f"unit grouping: {refused} of {len(specs)} groupings not priced ({why})")
    return sorted(out, key=lambda gr: gr.iter_us)


def _changes(c: FsdpCandidate, profiled: FsdpCandidate) -> int:
    return sum(a != b for a, b in zip(c.reshard, profiled.reshard)) + (c.reduce_dtype is not None)


def _refuse_impossible(ev: FsdpEvaluator, units: list[str], dtypes: list[str | None], budget: float, source: str | None) -> None:
    """One line when not even every unit resharded (the least memory) fits the budget."""
    least = min((ev.score(FsdpCandidate((True,) * len(units), d)) for d in dtypes), key=lambda s: s.memory.total)
    if least.fits:
        return
    m = least.memory
    mb = lambda x: f"{x / MB:.1f} MB"  # noqa: E731
    raise DagprofError(f"no FSDP strategy fits {mb(budget)} per rank: the least dagprof can reach is {mb(m.total)} with every unit "
                       f"resharded after forward (shards {mb(m.params)}, optimizer state {mb(m.optimizer)}, gradients {mb(m.grads)}, "
                       f"activations {mb(m.activations)}, gathered {mb(m.gathered)}, at the {m.at})", source)


def predict_fsdp(g: Graph, strategy: Strategy) -> tuple[Prediction, Graph]:
    """``strategy``'s FSDP plan priced on this profile (each verification round's): the prediction and the graph predicted for it."""
    plan = strategy.fsdp
    fs = g.meta.fsdp
    if fs is None:
        raise DagprofError("an FSDP strategy is priced on an FSDP profile; this one is not")
    by_name = {u.name: u for u in fs.units}
    why = plan.mismatch({u.name: u.numel for u in fs.units}, "in it", "in the run")
    if why:
        raise DagprofError(f"strategy does not match this run: {why}")
    units = [u.name for u in fs.units]
    want = {u.name: u.reshard_after_forward for u in plan.units}
    ev = FsdpEvaluator(g, units, None)
    base = ev.score(FsdpCandidate(tuple(resharded(by_name[n], None) for n in units)))
    cand = FsdpCandidate(tuple(want.get(n, resharded(by_name[n], None)) for n in units), plan.reduce_dtype)
    return Prediction(base.iter_us / 1e3, ev.score(cand).iter_us / 1e3), ev.graph(cand)


def plan_change(g: Graph, strategy: Strategy) -> str:
    """What ``strategy``'s FSDP plan changes in the graph of profile ``g``, in words (``passes.fsdp.reshard_change``, and the
    reduce dtype): what an explanation of its prediction names."""
    _, predicted = predict_fsdp(g, strategy)
    parts = [reshard_change(g, predicted)]
    if strategy.fsdp.reduce_dtype:
        parts.append(f"reduces every unit's gradients in {strategy.fsdp.reduce_dtype}")
    return "; ".join(p for p in parts if p) or "changes nothing the graph models"
