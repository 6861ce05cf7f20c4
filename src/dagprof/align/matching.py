"""Match each rank's collectives to the same logical collective on the other ranks.

A transfer event (``Kind.COMM``) is identified by (process group, seq). When the trace
carried its own sequence number (``Seq``, 2026+ schemas) that key is authoritative. When
the reader counted ``seq`` itself, a rank that lost events (sampled traces, a profiling
window cut mid-collective) would shift every later key, so counted sequences are aligned
per group against a reference rank on their signature (step, collective, bytes, dtype) —
identical sequences give exactly the positional match. Whatever does not match is reported
with rank and position, never guessed: ``strict`` raises, otherwise ``Matching.problems``
lists it and the event keeps instance -1.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

import numpy as np

from ..errors import DagprofError
from ..traces.events import Kind, RankTrace, Run

# Collectives whose per-rank payload legitimately differs (uneven splits).
_UNEVEN = frozenset({"alltoall", "sendrecv", "send", "recv", "gather", "scatter"})


@dataclass
class Instance:
    group: str
    seq: int
    name: str
    nbytes: int
    ranks: list[int]
    collective: str = ""  # canonical: allreduce, broadcast, allgather, alltoall, ...
    dtype: str = ""


@dataclass
class Matching:
    instance: list[np.ndarray]  # per rank (position in run.ranks): event index -> instance id, -1 none
    instances: list[Instance]
    problems: list[str] = field(default_factory=list)

    def complete(self, world: int | None = None) -> list[int]:
        """Ids of instances every participating rank of the run has."""
        n = world if world is not None else max((len(i.ranks) for i in self.instances), default=0)
        return [k for k, it in enumerate(self.instances) if len(it.ranks) == n]


@dataclass
class _Op:
    event: int
    seq: int
    explicit: bool
    coll: str
    dtype: str
    nbytes: int
    step: int

    @property
    def signature(self) -> tuple[int, str, str, int]:
        """What must agree across ranks; ProfilerStep numbers count iterations, the same on every rank."""
        return (self.step, self.coll, self.dtype, -1 if self.coll in _UNEVEN else self.nbytes)


def _ops(trace: RankTrace) -> dict[str, list[_Op]]:
    """Transfers per group in seq order, with the canonical name and dtype the reader recorded."""
    ev = trace.events
    info = trace.meta.get("collectives") or {}
    by_event = {int(e): (c, d) for e, c, d in zip(info.get("event", []), info.get("coll", []), info.get("dtype", []))}
    explicit = bool(trace.meta.get("explicit_seq", False))
    out: dict[str, list[_Op]] = {}
    for i in np.flatnonzero((ev.kind == Kind.COMM) & (ev.group >= 0) & (ev.seq >= 0)).tolist():
        coll, dtype = by_event.get(i, (ev.name_of(i), ""))
        out.setdefault(trace.groups[int(ev.group[i])], []).append(
            _Op(i, int(ev.seq[i]), explicit, coll, dtype.lower(), int(ev.nbytes[i]), int(ev.step[i])))
    for ops in out.values():
        ops.sort(key=lambda o: o.seq)
    return out


def match_collectives(run: Run, strict: bool = True) -> Matching:
    """Match COMM events of every rank; mismatches raise when ``strict``."""
    per_rank_ops = [_ops(t) for t in run.ranks]
    instance = [np.full(len(t.events), -1, dtype=np.int64) for t in run.ranks]
    instances: list[Instance] = []
    problems: list[str] = []
    present = {t.rank for t in run.ranks}
    for g in sorted({g for ops in per_rank_ops for g in ops}):
        holders = [p for p, ops in enumerate(per_rank_ops) if g in ops]
        members = set(run.ranks[holders[0]].group_ranks.get(g, [])) & present or present
        for r in sorted(members - {run.ranks[p].rank for p in holders}):
            problems.append(f"rank {r}: no collectives of group {g} in its trace")
        ref = max(holders, key=lambda p: len(per_rank_ops[p][g]))
        ref_ops = per_rank_ops[ref][g]
        ids = list(range(len(instances), len(instances) + len(ref_ops)))
        ref_ev = run.ranks[ref].events
        for k, op in zip(ids, ref_ops):
            instances.append(Instance(g, op.seq, ref_ev.name_of(op.event), op.nbytes, [run.ranks[ref].rank], op.coll, op.dtype))
            instance[ref][op.event] = k
        for p in holders:
            if p != ref:
                _match_rank(run.ranks[p], per_rank_ops[p][g], ref_ops, ids, instances, instance[p], problems, run.ranks[ref].rank, g)
        for k in ids:
            missing = sorted(members - set(instances[k].ranks))
            if missing:
                it = instances[k]
                problems.append(f"collective #{it.seq} ({it.collective or it.name}) of group {g} is missing on rank(s) {_short(missing)}")
    if problems and strict:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DagprofError(f"mismatched collectives: {problems[0]}{more}", run.source)
    return Matching(instance, instances, problems)


def _match_rank(trace: RankTrace, ops: list[_Op], ref_ops: list[_Op], ids: list[int], instances: list[Instance],
                inst: np.ndarray, problems: list[str], ref_rank: int, g: str) -> None:
    r = trace.rank
    if ops and ref_ops and ops[0].explicit and ref_ops[0].explicit:
        by_seq = {o.seq: k for k, o in enumerate(ref_ops)}
        pairs = [(by_seq[o.seq], k) for k, o in enumerate(ops) if o.seq in by_seq]
        for o in ops:
            if o.seq not in by_seq:
                problems.append(f"rank {r}: collective seq {o.seq} of group {g} has no counterpart on rank {ref_rank}")
    else:
        sm = difflib.SequenceMatcher(None, [o.signature for o in ref_ops], [o.signature for o in ops], autojunk=False)
        pairs = [(b.a + j, b.b + j) for b in sm.get_matching_blocks() for j in range(b.size)]
        matched = {k for _, k in pairs}
        for k, o in enumerate(ops):
            if k not in matched:
                problems.append(f"rank {r}: collective #{k} of group {g} ({o.coll}, {o.nbytes} B) matches nothing on rank {ref_rank}")
    for a, k in pairs:
        o, ref = ops[k], ref_ops[a]
        if o.signature != ref.signature:
            problems.append(f"rank {r}: collective seq {o.seq} of group {g} is {o.coll} {o.nbytes} B {o.dtype} in step {o.step}, "
                            f"rank {ref_rank} has {ref.coll} {ref.nbytes} B {ref.dtype} in step {ref.step}")
            continue
        it = instances[ids[a]]
        it.ranks.append(r)
        inst[o.event] = ids[a]


def _short(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"{ranks[:8]}... ({len(ranks)} ranks)"
