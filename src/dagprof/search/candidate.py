"""What the optimizer searches: a candidate strategy, and the table of its knobs.

Each knob is one search-able pass: the ``Candidate`` field it sets, the moves that change it during
the annealing, and how it reads and writes its field of the strategy file (``collect.deploy.strategy``)
that ``dagprof.apply`` deploys. A new search-able pass is the pass, its field and ``KNOBS`` entry
here, and its step in ``collect/apply.py``; the evaluator prices a candidate by the passes named
in each entry's comment (``search.evaluate``).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import accumulate
from typing import Any, Callable

import numpy as np

from ..collect.deploy.strategy import Bucket, Compression, Strategy
from ..costmodel.codecs import Codec
from ..errors import DagprofError
from ..passes.bucket_plan import Plan
from ..passes.gradients import GradientOrder
from ..passes.recompute import Segment

PARTS = (1, 2, 4)


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


Hot = dict[str, list[int]]  # bucket ends on the replayed critical path: "late" (waited for gradients), "busy" (waited for the channel)


@dataclass
class Space:
    """What one run's candidates are made of: its gradients in ready order, the modules it may recompute,
    its layers' names (to name bucket boundaries) and the codecs allowed."""

    order: GradientOrder
    segments: list[Segment]
    layer_names: tuple[str, ...] = ()
    codecs: tuple[Codec, ...] = (Codec(),)

    @cached_property
    def allowed(self) -> np.ndarray:
        """Where a bucket may end: layer ends and the profiled layout's ends."""
        return np.union1d(self.order.boundaries(), np.asarray(self.order.profiled_ends, dtype=np.int64))


@dataclass(frozen=True)
class Move:
    """One kind of proposal: its share of proposals, when it applies (else the next move in the table is
    taken) and the neighbour it makes."""

    weight: float
    when: Callable[[Space, Candidate, Hot], bool]
    make: Callable[[random.Random, Space, Candidate, Hot], Candidate]


@dataclass(frozen=True)
class Knob:
    field: str  # the Candidate field
    strategy_field: str  # the Strategy field apply() reads
    to_strategy: Callable[[Space, Any], Any]
    from_strategy: Callable[[Space, Any], Any]
    moves: tuple[Move, ...] = ()


# --- bucket layout ---------------------------------------------------------------------------------------------------

def _guided(rng: random.Random, sp: Space, c: Candidate, hot: Hot) -> Candidate:
    """dPRO's critical-path moves: a bucket that became ready too late is split, one behind a busy
    channel is merged with the one before it (fewer collectives) or compressed (fewer bytes)."""
    ends, allowed = list(c.ends), sp.allowed
    if hot["late"] and (not hot["busy"] or rng.random() < 0.6):
        end = rng.choice(hot["late"])
        k = ends.index(end) if end in ends else None
        lo = ends[k - 1] if k else -1
        inside = allowed[(allowed > lo) & (allowed < end)]
        if len(inside):
            cum = np.cumsum(sp.order.nbytes)
            half = (cum[lo] if lo >= 0 else 0) + (cum[end] - (cum[lo] if lo >= 0 else 0)) * rng.uniform(0.2, 0.8)
            split = int(inside[np.argmin(np.abs(cum[inside] - half))])
            return replace(c, ends=tuple(sorted(ends + [split])))
    end = rng.choice(hot["busy"] or hot["late"])
    if len(sp.codecs) > 1 and rng.random() < 0.3:
        return replace(c, codec=rng.choice(sp.codecs))
    k = ends.index(end) if end in ends else -1
    if k > 0:
        return replace(c, ends=tuple(e for e in ends if e != ends[k - 1]))
    return c


def _shift(rng: random.Random, sp: Space, c: Candidate, hot: Hot) -> Candidate:
    """A boundary moved to a neighbouring layer end."""
    ends, allowed = list(c.ends), sp.allowed
    k = rng.randrange(len(ends) - 1)
    pos = int(np.searchsorted(allowed, ends[k]))
    new = allowed[min(max(pos + rng.choice((-2, -1, 1, 2)), 0), len(allowed) - 1)]
    lo = ends[k - 1] if k else -1
    if lo < new < ends[k + 1]:
        ends[k] = int(new)
        return replace(c, ends=tuple(ends))
    return c


def _merge(rng: random.Random, sp: Space, c: Candidate, hot: Hot) -> Candidate:
    ends = list(c.ends)
    ends.pop(rng.randrange(len(ends) - 1))
    return replace(c, ends=tuple(ends))


def _split(rng: random.Random, sp: Space, c: Candidate, hot: Hot) -> Candidate:
    new = int(rng.choice(sp.allowed.tolist()))
    return replace(c, ends=tuple(sorted(set(c.ends) | {new})))


def _buckets_out(sp: Space, ends: tuple[int, ...]) -> tuple[Bucket, ...] | None:
    o = sp.order
    if ends == o.profiled_ends:
        return None
    return tuple(Bucket(o.params[a : z + 1], int(o.nbytes[a : z + 1].sum()), _layer_names(o, a, z, sp.layer_names))
                 for a, z in o.bucket_params(ends))


def _buckets_in(sp: Space, buckets: tuple[Bucket, ...] | None) -> tuple[int, ...]:
    o = sp.order
    if buckets is None:
        return o.profiled_ends
    index = {p: i for i, p in enumerate(o.params)}
    missing = [p for b in buckets for p in b.params if p not in index]
    if missing:
        raise DagprofError(f"strategy does not match this run: parameter {missing[0]!r} is not in its DDP buckets")
    return tuple(sorted(index[b.params[-1]] for b in buckets))


def _layer_names(o: GradientOrder, a: int, z: int, names: tuple[str, ...]) -> tuple[str, ...]:
    seen: list[str] = []
    for lay in o.layer[a : z + 1].tolist():
        if names[lay] not in seen:
            seen.append(names[lay])
    return tuple(seen)


# --- recomputation ---------------------------------------------------------------------------------------------------

def _toggle_recompute(rng: random.Random, sp: Space, c: Candidate, hot: Hot) -> Candidate:
    segs = sp.segments
    i = rng.randrange(len(segs))
    chosen = set(c.recompute)
    if i in chosen:
        chosen.discard(i)
    else:  # recomputing a module and one inside it recomputes twice: keep the outer one
        chosen = {j for j in chosen if not (segs[i].contains(segs[j]) or segs[j].contains(segs[i]))}
        chosen.add(i)
    return replace(c, recompute=frozenset(chosen))


def _modules_out(sp: Space, recompute: frozenset[int]) -> tuple[str, ...]:
    return tuple(sp.segments[i].module for i in sorted(recompute))


def _modules_in(sp: Space, modules: tuple[str, ...]) -> frozenset[int]:
    return frozenset(i for i, sg in enumerate(sp.segments) if sg.module in modules)


def _same(sp: Space, value: Any) -> Any:
    return value


def _many_buckets(sp: Space, c: Candidate, hot: Hot) -> bool:
    return len(c.ends) > 1


def _always(sp: Space, c: Candidate, hot: Hot) -> bool:
    return True


# Proposals take the moves in this order: the first whose cumulative share passes the draw and that applies.
KNOBS: tuple[Knob, ...] = (
    # bucket layout: passes.bucket_plan.BucketSlots (buckets re-formed, priced by the run's fitted link); apply: _rebuild_reducer
    Knob("ends", "buckets", _buckets_out, _buckets_in, (
        Move(0.50, lambda sp, c, hot: bool(hot["late"] or hot["busy"]), _guided),
        Move(0.12, _many_buckets, _shift),
        Move(0.10, _many_buckets, _merge),
        Move(0.10, _always, _split))),
    # gradient codec (--allow-lossy): BucketSlots at the measured codec costs; apply: _comm_hook (codec_hook, PowerSGD)
    Knob("codec", "compression", lambda sp, codec: Compression(codec.name, codec.rank), lambda sp, comp: comp.as_codec, (
        Move(0.08, lambda sp, c, hot: len(sp.codecs) > 1, lambda rng, sp, c, hot: replace(c, codec=rng.choice(sp.codecs))),)),
    # tensor partition: BucketSlots, each bucket in k collectives; apply: _comm_hook (codec_hook's pieces)
    Knob("parts", "partition", _same, _same, (
        Move(0.05, _always, lambda rng, sp, c, hot: replace(c, parts=rng.choice(PARTS))),)),
    # recomputation (--memory-budget): passes.recompute.RecomputeSlots; apply: _checkpoint
    Knob("recompute", "recompute", _modules_out, _modules_in, (
        Move(0.05, lambda sp, c, hot: bool(sp.segments), _toggle_recompute),)),
    # gradient accumulation (--accumulate, seeds only): passes.accumulate.accumulate_gradients; apply: Applied.sync
    Knob("accumulate", "accumulate", _same, _same),
    # gradients as bucket views (memory fitting, seeds only): memory model only; apply: _rebuild_reducer
    Knob("bucket_view", "grad_as_bucket_view", _same, _same),
)
MOVES = tuple(m for k in KNOBS for m in k.moves)
LIMITS = tuple(round(x / sum(m.weight for m in MOVES), 9) for x in accumulate(m.weight for m in MOVES))  # cumulative shares


def propose(rng: random.Random, sp: Space, c: Candidate, hot: Hot) -> Candidate:
    """A neighbour of ``c``: the first move of the table whose cumulative share passes one draw and that applies."""
    r = rng.random()
    for limit, m in zip(LIMITS, MOVES):
        if r < limit and m.when(sp, c, hot):
            return m.make(rng, sp, c, hot)
    return c


def strategy_fields(sp: Space, c: Candidate) -> dict[str, Any]:
    """``c`` as the Strategy fields that ``apply`` deploys."""
    return {k.strategy_field: k.to_strategy(sp, getattr(c, k.field)) for k in KNOBS}


def candidate_of(sp: Space, s: Strategy) -> Candidate:
    """The candidate a strategy file says, on this run (refused in one line when its parameters are not the run's)."""
    return Candidate(**{k.field: k.from_strategy(sp, getattr(s, k.strategy_field)) for k in KNOBS})


def complexity(c: Candidate) -> tuple:
    """Fewer moving parts first: no partition, no recomputation, lossless, fewer buckets."""
    return (c.parts > 1, len(c.recompute), c.codec.name != "none", len(c.ends))
