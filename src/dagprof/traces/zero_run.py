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
from .events import CommKind, CommRole, Kind
from .run_comm import hook_comm
from .run_schema import Col, Rec, ZeroInfo
from .run_spans import _Comm, _Span, _Transfer

ZERO_OVERLAP_HOOK = "hook_with_zero_step(allreduce_hook)"  # the comm hook's name in a rank file: ZeRO stepped around DDP's all-reduce


def zero_name(owner: int) -> str:
    """The name a ZeRO parameter broadcast takes (``broadcast`` first: the cost model's kind reads it); later stages tell
    it by its role (``CommRole.ZERO_PARAMS``), which the reader sets with it."""
    return f"broadcast ZeRO params of rank {owner}"


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
    unmatched, labelled = 0, set()
    for u0, u1 in spans:
        issued = {h.seq: h.end for h in comm.host if u0 <= h.start <= u1 and h.comm_kind == CommKind.BROADCAST and h.seq in at}
        if len(issued) != per_step:
            unmatched += 1
            continue
        for seq, owner, nbytes in zip(sorted(issued), zero.owners, zero.nbytes):
            k = at[seq]
            start = min(comm.transfers[k].start, issued[seq])
            comm.transfers[k] = replace(comm.transfers[k], name=zero_name(owner), nbytes=int(nbytes), start=start, root=owner,
                                        role=CommRole.ZERO_PARAMS, comm_kind=CommKind.BROADCAST)
            labelled.add(seq)
    comm.host = [replace(h, role=CommRole.ZERO_PARAMS) if h.seq in labelled else h for h in comm.host]
    if unmatched:
        warnings.append(f"rank {rank}: {unmatched} optimizer step(s) did not issue ZeroRedundancyOptimizer's {per_step} parameter "
                        f"broadcasts ({total:.1f} MB) as listed: theirs stay unsized (0 B, kept as measured by link what-ifs)")


ZERO_STEP = "ZeRO step of bucket "  # its overlapped local step (an UPDATE on the main lane, inside backward)
ZERO_AR_WAIT = "ZeRO waits for all-reduce of bucket "
ZERO_BCAST_WAIT = "ZeRO waits for its broadcasts"


def overlap_comm(records: np.ndarray, zero: ZeroInfo, steps: list, kineto: bool, warnings: list[str], path: str) -> _Comm:
    """The transfers of ZeRO's overlapped step (``collect.hooks.zero.ZeroOverlap``) and DDP's all-reduces, each from its
    issue to its completion as the hooks saw them: Kineto shows the broadcasts issued inside backward without a host span
    to tie them to, so its spans are left aside. A profiled step whose hook did not step (the first iterations, before
    DDP's buckets are final) or broadcast another count is refused: its time is not the training step's."""
    if len(zero.buckets) != len(zero.owners):
        raise DagprofError(f"ZeroRedundancyOptimizer record lists {len(zero.buckets)} buckets for {len(zero.owners)} broadcasts: a damaged file", path)
    code, t = records[:, Col.CODE], records[:, Col.T_NS]
    per_step = [(s, int(np.count_nonzero((code == Rec.ZERO_BCAST_END) & (t >= b0) & (t <= b1)))) for s, b0, b1 in steps]
    off = [(s, n) for s, n in per_step if n != len(zero.buckets)]
    if off:
        raise DagprofError(f"ZeroRedundancyOptimizer(overlap_with_ddp=True) broadcast {off[0][1]} of its {len(zero.buckets)} buckets in "
                           f"profiled step {off[0][0]} ({len(off)} of {len(steps)} steps so; it steps nothing in its first iterations, "
                           "while DDP's buckets are not final): profile later steps (--steps)", path)
    if kineto:
        warnings.append("ZeroRedundancyOptimizer(overlap_with_ddp=True): transfers are the comm hooks' issue to completion "
                        "(Kineto shows the broadcasts issued inside backward without their host calls)")
    comm = hook_comm(records, 0)  # ZeRO's hook issues no collective of the job's own (``hook_calls``)
    owner = {int(r[Col.B]): int(r[Col.X]) for r in records[code == Rec.ZERO_BCAST_BEGIN]}
    issued = {int(r[Col.B]): (int(r[Col.T_NS]), int(r[Col.X])) for r in records[code == Rec.ZERO_BCAST_END]}
    for r in records[code == Rec.COMM_DONE]:
        seq = int(r[Col.B])
        if seq in issued and seq in owner:
            t0, nbytes = issued[seq]
            comm.transfers.append(_Transfer(seq, -1, zero_name(owner[seq]), t0, int(r[Col.T_NS]), f"comm thread {int(r[Col.X])}", nbytes,
                                            root=owner[seq], role=CommRole.ZERO_PARAMS, comm_kind=CommKind.BROADCAST))
    comm.transfers.sort(key=lambda tr: tr.seq)
    return comm


def overlap_spans(code: np.ndarray, a: np.ndarray, b: np.ndarray, t: np.ndarray, x: np.ndarray) -> list[_Span]:
    """The main-lane spans of ZeRO's overlapped step in one step's records: each broadcast's issue, each local step, the
    wait for all broadcasts, and before each local step the wait for its bucket's all-reduce (``hook_with_zero_step``
    waits for it right before stepping: from the hook's previous record, the all-reduce's issue or the previous
    bucket's step or broadcast)."""
    spans = []
    begun = {int(b[i]): int(t[i]) for i in np.flatnonzero(code == Rec.ZERO_BCAST_BEGIN)}
    owner = {int(b[i]): int(x[i]) for i in np.flatnonzero(code == Rec.ZERO_BCAST_BEGIN)}
    for i in np.flatnonzero(code == Rec.ZERO_BCAST_END):
        seq = int(b[i])
        if seq in begun:
            spans.append(_Span(Kind.COMM_ENQUEUE, zero_name(owner[seq]), begun[seq], int(t[i]), seq=seq, nbytes=int(x[i]), root=owner[seq],
                               role=CommRole.ZERO_PARAMS, comm_kind=CommKind.BROADCAST))
    before = np.sort(t[np.isin(code, (Rec.ENQ_END, Rec.ZERO_BCAST_END, Rec.ZERO_STEP_END))])
    for s0, s1, bucket in zip(t[code == Rec.ZERO_STEP_BEGIN], t[code == Rec.ZERO_STEP_END], a[code == Rec.ZERO_STEP_BEGIN]):
        k = int(np.searchsorted(before, s0, side="right")) - 1
        if k >= 0:
            spans.append(_Span(Kind.COMM_WAIT, f"{ZERO_AR_WAIT}{int(bucket)}", int(before[k]), int(s0)))
        spans.append(_Span(Kind.UPDATE, f"{ZERO_STEP}{int(bucket)}", int(s0), int(s1)))
    spans += [_Span(Kind.COMM_WAIT, ZERO_BCAST_WAIT, int(s0), int(s1)) for s0, s1 in zip(t[code == Rec.ZERO_WAIT_BEGIN], t[code == Rec.ZERO_WAIT_END])]
    return spans


def overlap_targets(spans: list[_Span]) -> dict[int, int]:
    """Span index -> the span index that waits for its transfer, among one step's main-lane ``spans``: a bucket's
    all-reduce -> the wait before its owner's step (other ranks' buckets: none here, DDP's finalize as for any bucket);
    each ZeRO broadcast -> the wait for all broadcasts after it (the next forward runs after that, on the same lane)."""
    ar_wait = {int(s.name[len(ZERO_AR_WAIT):]): k for k, s in enumerate(spans) if s.kind == Kind.COMM_WAIT and s.name.startswith(ZERO_AR_WAIT)}
    out = {}
    for k, s in enumerate(spans):
        if s.kind != Kind.COMM_ENQUEUE:
            continue
        if s.bucket >= 0 and s.bucket in ar_wait:
            out[k] = ar_wait[s.bucket]
        elif s.root >= 0:
            out[k] = next((j for j in range(k + 1, len(spans)) if spans[j].name == ZERO_BCAST_WAIT), None)
    return {k: j for k, j in out.items() if j is not None}
