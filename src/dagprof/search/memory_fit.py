"""A starting point under a memory budget: gradients as bucket views, then modules recomputed."""
from __future__ import annotations

from ..costmodel.codecs import Codec
from ..passes.gradients import GradientOrder
from ..passes.recompute import Segment
from ..units import MB
from .evaluate import Evaluator
from .memory import MemoryModel


def fit_memory(memory: MemoryModel | None, budget: float | None, cand_segments: list[Segment], ev: Evaluator,
               order: GradientOrder) -> tuple[frozenset[int], bool, str | None]:
    """A starting point that fits the memory budget: gradients as bucket views, then modules recomputed
    greedily by bytes freed per microsecond of recomputation; the reason when even all of it does not fit."""
    if memory is None or budget is None:
        return frozenset(), False, None
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
    mb = lambda x: f"{x / MB:.0f} MB" if x >= MB else f"{x:,.0f} bytes"  # noqa: E731  (--memory-budget 64 is 64 bytes, not "0 MB")
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
