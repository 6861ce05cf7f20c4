"""How the optimizer walks the candidates: seeds, then simulated annealing guided by the critical path.

Seeds are the profiled layout, DDP-style layouts for a grid of bucket caps, one bucket per layer and
one for all, each with every allowed codec and micro-batch count. The annealing starts from the best
seed; each proposal is a move of ``search.candidate.KNOBS``, half of them guided by where the current
candidate's replayed critical path waits (dPRO). Deterministic for a seed: the same candidates are
proposed in the same order.
"""
from __future__ import annotations

import math
import random
import time
from typing import Callable

import numpy as np

from ..analysis.critical_path import critical_path
from ..units import MB
from .candidate import Candidate, Hot, Space, propose
from .evaluate import Evaluator, Scored

SEED_CAPS_MB = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0)


def seeds(sp: Space, accumulate: list[int], recompute: frozenset[int], bucket_view: bool) -> list[Candidate]:
    """Where the search starts, every seed with the recomputation and bucket views that fit the memory budget."""
    order, allowed = sp.order, sp.allowed
    layouts = {order.profiled_ends, tuple(allowed.tolist()), (len(order) - 1,)}
    for cap in SEED_CAPS_MB:
        for first in (None, MB):
            layouts.add(_snap(order.layout_from_caps(cap * MB, first), allowed))
    return [Candidate(ends, codec, 1, recompute, k, bucket_view) for k in accumulate for codec in sp.codecs for ends in sorted(layouts)]


def anneal(ev: Evaluator, sp: Space, start: list[Candidate], rng: random.Random, t0: float, budget_s: float, max_candidates: int,
           patience: int, report: Callable[[float], None]) -> list[Scored]:
    """Score the seeds (within half the budget), then anneal from the best until the budget, ``max_candidates``
    proposals or ``patience`` proposals in a row without a better one; every candidate stays in ``ev.cache``.
    Returns the scored seeds; ``report`` gets the best objective so far."""
    scored: list[Scored] = []
    for c in start:
        if time.perf_counter() - t0 > budget_s * 0.5 and scored:
            break
        scored.append(ev.score(c)[0])
        report(min(ev.objective(s) for s in scored))
    cur = min(scored, key=ev.objective)
    best = cur
    temp = 0.02 * cur.iter_us
    cur_path = _hot(ev, cur)
    stale = 0
    proposals = 0
    while (time.perf_counter() - t0 < budget_s and proposals < max_candidates and stale < patience):
        proposals += 1
        c = propose(rng, sp, cur.candidate, cur_path)
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
            report(ev.objective(best))
    return scored


def _snap(ends: tuple[int, ...], allowed: np.ndarray) -> tuple[int, ...]:
    """Bucket ends moved to the nearest allowed boundary at or after them (layer ends), deduplicated."""
    idx = np.searchsorted(allowed, np.asarray(ends), side="left")
    snapped = allowed[np.minimum(idx, len(allowed) - 1)]
    return tuple(sorted(set(snapped.tolist())))


def _hot(ev: Evaluator, s: Scored) -> Hot:
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
