"""Match each rank's collectives to the same logical collective on the other ranks.

Key: (process group, seq) — readers fill ``seq`` from the trace's own sequence number when it
has one, else by counting per group. A key present on some ranks only, or whose name or size
differs between ranks, is a mismatch: reported with rank and position, never guessed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import DagprofError
from ..traces.events import Kind, Run


@dataclass
class Instance:
    group: str
    seq: int
    name: str
    nbytes: int
    ranks: list[int]


@dataclass
class Matching:
    instance: list[np.ndarray]  # per rank (position in run.ranks): event index -> instance id, -1 none
    instances: list[Instance]
    problems: list[str] = field(default_factory=list)


def match_collectives(run: Run, strict: bool = True) -> Matching:
    """Match COMM events of every rank by (group, seq); mismatches raise when ``strict``."""
    keys: dict[tuple[str, int], int] = {}
    instances: list[Instance] = []
    per_rank: list[np.ndarray] = []
    problems: list[str] = []
    for trace in run.ranks:
        ev = trace.events
        inst = np.full(len(ev), -1, dtype=np.int64)
        for i in np.flatnonzero((ev.kind == Kind.COMM) & (ev.group >= 0) & (ev.seq >= 0)):
            key = (trace.groups[int(ev.group[i])], int(ev.seq[i]))
            k = keys.get(key)
            if k is None:
                k = keys[key] = len(instances)
                instances.append(Instance(key[0], key[1], ev.name_of(i), int(ev.nbytes[i]), []))
            it = instances[k]
            if it.ranks and it.ranks[-1] == trace.rank:
                problems.append(f"rank {trace.rank}: collective #{key[1]} of group {key[0]} appears twice")
                continue
            if ev.nbytes[i] and it.nbytes and int(ev.nbytes[i]) != it.nbytes:
                problems.append(
                    f"rank {trace.rank}: collective #{key[1]} of group {key[0]} moves {int(ev.nbytes[i])} bytes, rank {it.ranks[0]} moves {it.nbytes}"
                )
            it.ranks.append(trace.rank)
            inst[i] = k
        per_rank.append(inst)
    present = {t.rank for t in run.ranks}
    for it in instances:
        missing = present - set(it.ranks)
        if missing:
            problems.append(f"collective #{it.seq} ({it.name}) of group {it.group} is missing on rank(s) {sorted(missing)}")
    if problems and strict:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DagprofError(f"mismatched collectives: {problems[0]}{more}", run.source)
    return Matching(per_rank, instances, problems)
