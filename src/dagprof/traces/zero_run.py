"""A ZeRO-1 rank's parameter broadcasts (``RankFile.zero``, ``collect.hooks.zero``) told apart and sized.

Kineto records gloo's ``broadcast`` without its bytes, so the broadcasts of a ``ZeroRedundancyOptimizer`` step (the
whole model, each parameter from its owner) read as collectives of 0 B: no link what-if re-priced them. Inside each
update span (the outer ``step()``: the local optimizer's step, then the broadcasts) the broadcasts this rank issued
are ZeRO's, in the order the collector listed them; they take its names and sizes, and each starts by the end of the
call that issued it. All are issued at once and gloo's two worker threads take them one after another, each the moment its
previous one ends (back to back on each thread in Kineto): a broadcast's span on its thread starts when the thread
came free, while the link carried the other thread's broadcast, not when the rank joined it. Taken as the join, that
wait was overhead (the collective's gap, ``graph.shared_collectives``) that no link what-if re-priced: on the testbed
at 1 Gbit/s, 49 ms a step of the 89 ms the broadcasts took. Without Kineto the collector sees no broadcast at all:
their time stays in the update, and the reader says so.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import DagprofError
from ..units import MB
from .run_schema import Col, Rec, ZeroInfo
from .run_spans import _Comm

ZERO_BROADCAST = "broadcast ZeRO params of rank "


def zero_name(owner: int) -> str:
    """The name a ZeRO parameter broadcast takes (``broadcast`` first: the cost model's kind reads it)."""
    return f"{ZERO_BROADCAST}{owner}"


def check_zero(zero: ZeroInfo, world: int, path: str) -> None:
    """A ZeRO record whose broadcasts and owners do not pair up, name an owner outside its group, or whose group is larger
    than the job is damaged: its sizes would be paired with the wrong broadcasts, or the shards priced for ranks that never
    were (``passes.zero.shard_bytes``)."""
    if len(zero.owners) != len(zero.nbytes) or not 1 <= zero.world_size <= world or any(not 0 <= o < zero.world_size for o in zero.owners):
        raise DagprofError(f"ZeroRedundancyOptimizer record lists {len(zero.nbytes)} broadcasts for {len(zero.owners)} owners "
                           f"({sorted(set(zero.owners))}) over {zero.world_size} ranks in a {world}-rank job: a damaged file", path)


def label_zero(comm: _Comm, zero: ZeroInfo, records: np.ndarray, rank: int, kineto: bool, warnings: list[str]) -> None:
    """Name and size ZeRO's broadcasts in ``comm`` (in place); a warning where a step's do not match the list."""
    per_step = len(zero.nbytes)
    total = sum(zero.nbytes) / MB
    if not kineto:
        warnings.append(f"rank {rank}: ZeroRedundancyOptimizer's {per_step} parameter broadcasts a step ({total:.1f} MB) are not "
                        "seen without Kineto: their time counts as the optimizer step's and no link what-if re-prices it")
        return
    code, t = records[:, Col.CODE], records[:, Col.T_NS]
    spans = zip(t[code == Rec.UPDATE_BEGIN].tolist(), t[code == Rec.UPDATE_END].tolist())
    at = {tr.seq: k for k, tr in enumerate(comm.transfers)}
    unmatched = 0
    for u0, u1 in spans:
        issued = {h.seq: h.end for h in comm.host if u0 <= h.start <= u1 and "broadcast" in h.name and h.seq in at}
        if len(issued) != per_step:
            unmatched += 1
            continue
        for seq, owner, nbytes in zip(sorted(issued), zero.owners, zero.nbytes):
            k = at[seq]
            start = min(comm.transfers[k].start, issued[seq])
            comm.transfers[k] = replace(comm.transfers[k], name=zero_name(owner), nbytes=int(nbytes), start=start)
    if unmatched:
        warnings.append(f"rank {rank}: {unmatched} optimizer step(s) did not issue ZeroRedundancyOptimizer's {per_step} parameter "
                        f"broadcasts ({total:.1f} MB) as listed: theirs stay unsized (0 B, kept as measured by link what-ifs)")
