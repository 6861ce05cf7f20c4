"""A dagprof rank's DDP collectives as transfers (``run_spans._Comm``), and how its comm-hook records map onto them.

With Kineto, the transfers are the ``gloo:*`` ops on the ``pt_gloo_runloop`` threads (or NCCL kernels), one lane
per thread/stream, all-reduces matched to the comm hook's buckets in issue order; DDP's buffer broadcasts appear
too (bucket -1, host side from Kineto), and the GPU's kernels and copies are kept for their stream lanes.
Without Kineto, the comm hook's issue -> completion span on the thread that completed it.
``seq`` numbers the collectives of group "0" in issue order over the window (equal on all ranks).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import DagprofError
from .comm_kind import P2P
from .completeness import SAME_JOB_SLACK_NS
from .events import CommKind, CommRole, Dep, Kind, Lane, LaneKind, RankTrace
from .meta import HookWire, UnseenCollective
from .parallelism import described_dp_group, in_op_groups
from .run_schema import OWN_KINDS, Col, Rec
from .run_spans import _Comm, _DeviceOp, _InOp, _Span, _Transfer


def bucket_name(bucket: int, role: CommRole) -> str:
    """A DDP bucket's collective: a sparse gradient's is gloo's all-gather of every rank's indices and values (its bytes
    the gathered ones, priced as an all-gather: ``bucket_kind``). The name is for people; what the bucket is, later
    stages read from its role and kind."""
    return f"allgather sparse bucket {bucket}" if role == CommRole.SPARSE else f"allreduce bucket {bucket}"


def bucket_kind(role: CommRole) -> CommKind:
    """A DDP bucket's collective: a sparse gradient's all-gathers every rank's rows, a dense one's all-reduces."""
    return CommKind.ALL_GATHER if role == CommRole.SPARSE else CommKind.ALL_REDUCE


def bucket_roles(records: np.ndarray) -> dict[int, CommRole]:
    """The comm hook's calls (by seq) -> their bucket's role: SPARSE where it held a sparse gradient (``Rec.ENQ_BEGIN``'s
    x, which the collector sets from the gradient), else PLAIN. The one place a DDP bucket's role is read."""
    begin = records[records[:, Col.CODE] == Rec.ENQ_BEGIN]
    return {int(r[Col.B]): CommRole.SPARSE if r[Col.X] == 1 else CommRole.PLAIN for r in begin}


@dataclass
class HookCall:
    """A bucket's call of a comm hook of the job's own, and the collectives the hook called in it (kind, ns, bytes per
    rank; -1: not in DDP's group, or a kind not recorded)."""

    bucket: int
    issued: list[tuple[CommKind, int, int]] = field(default_factory=list)  # issued for later (``Rec.HOOK_COLL``), in order
    blocking: list[tuple[CommKind, int, int]] = field(default_factory=list)  # blocked on inside the call (``Rec.HOOK_BLOCKING``)
    # the rank's hook also called collectives after its calls (``Rec.HOOK_LATE``: PowerSGD's from its futures' callbacks):
    # which call each belongs to, and how many more no record caught, is unknown, so no call's records hold its whole wire
    late: bool = False


def hook_calls(records: np.ndarray) -> dict[int, HookCall]:
    """Each bucket call (by seq) under a comm hook of the job's own, with its collectives; {} where the rank recorded none
    (DDP's all-reduce, torch's fp16/bf16 casts, ZeRO's step, an older file). The hook is one for every bucket: a call that
    recorded none put nothing the collector sees on the wire."""
    code = records[:, Col.CODE]
    own = records[np.isin(code, (Rec.HOOK_COLL, Rec.HOOK_BLOCKING))]
    if not len(own) and not (code == Rec.HOOK_LATE).any():
        return {}
    late = bool((code == Rec.HOOK_LATE).any())
    calls = {int(r[Col.B]): HookCall(int(r[Col.A]), late=late) for r in records[code == Rec.ENQ_END]}
    for r in own[np.argsort(own[:, Col.T_NS], kind="stable")]:
        if (call := calls.get(int(r[Col.B]))) is not None:  # a kind past OWN_KINDS (a damaged file) prices nothing (``hook_transfer``)
            kind = OWN_KINDS[int(r[Col.A])] if 0 <= r[Col.A] < len(OWN_KINDS) else CommKind.UNKNOWN
            (call.issued if r[Col.CODE] == Rec.HOOK_COLL else call.blocking).append((kind, int(r[Col.T_NS]), int(r[Col.X])))
    return calls


def hook_transfer(call: HookCall, world: int) -> tuple[CommKind, int] | None:
    """The kind and bytes of the transfer a bucket's hook call puts on the wire: its all-reduces' bytes summed, or its
    all-gathers' gathered ones (``world`` times each rank's, as a sparse bucket's); None where it is no one such kind in
    DDP's group (several kinds in one call would need their prices summed one by one: not modelled), or where the hook
    called collectives after its calls (``HookCall.late``)."""
    kinds = {k for k, _, _ in call.issued}
    if call.late or len(kinds) != 1 or not kinds <= {CommKind.ALL_REDUCE, CommKind.ALL_GATHER} or any(b < 0 for _, _, b in call.issued):
        return None
    kind, total = kinds.pop(), sum(b for _, _, b in call.issued)
    return kind, kind.event_bytes(total, world)


def hook_wire(records: np.ndarray, world: int) -> HookWire | None:
    """The rank's ``HookWire`` from its hook calls (``hook_calls``) and what the hook called after them (``Rec.HOOK_LATE``);
    None where none was recorded."""
    calls = hook_calls(records)
    if not calls:
        return None
    priced = {seq: hook_transfer(c, world) for seq, c in calls.items()}
    per_bucket: dict[int, set[int]] = {}
    for seq, c in calls.items():
        per_bucket.setdefault(c.bucket, set()).add(-1 if priced[seq] is None else priced[seq][1])
    blocking = [b for c in calls.values() for _, _, b in c.blocking]
    # a call that blocked on a collective of another group or an unrecorded kind (bytes -1) is unpriced too: its share unknown
    return HookWire(calls=len(calls), unpriced=sum(priced[seq] is None or any(b < 0 for _, _, b in c.blocking) for seq, c in calls.items()),
                    kinds=sorted({k.label for c in calls.values() for k, _, _ in c.issued}),
                    most=max(len(c.issued) for c in calls.values()), issued_bytes=sum(max(b, 0) for c in calls.values() for _, _, b in c.issued),
                    blocking=len(blocking), blocking_bytes=sum(max(b, 0) for b in blocking),
                    late=int(np.count_nonzero(records[:, Col.CODE] == Rec.HOOK_LATE)),
                    wire={b: next(iter(s)) for b, s in sorted(per_bucket.items()) if len(s) == 1}, varying=any(len(s) > 1 for s in per_bucket.values()))


def _hooked(t: _Transfer, call: HookCall | None, world: int) -> _Transfer:
    """A bucket's transfer under a hook of the job's own (``call``): with the kind and bytes its call put on the wire
    (``hook_transfer``) where it is priced, else the bucket's as DDP would all-reduce it. Its role is the hook's either way,
    so that matching ignores its bytes on every rank: whether a call's collectives ran inside it or from its futures'
    callbacks later is a race each rank runs its own way (PowerSGD's, for the same bucket and step), and a priced call on
    one rank met an unpriced one, with other bytes, on the other ("matches nothing")."""
    if call is None:
        return t
    wire = hook_transfer(call, world)
    if wire is None:
        return replace(t, role=CommRole.HOOK, name=f"{t.name} (comm hook)")
    return replace(t, role=CommRole.HOOK, comm_kind=wire[0], nbytes=wire[1], name=f"{wire[0].label} bucket {t.bucket} (comm hook)")


def hook_comm(records: np.ndarray, world: int) -> _Comm:
    """Fallback without Kineto: the comm hook's issue -> completion span (includes queueing and waiting for peers)."""
    code = records[:, Col.CODE]
    issued = {int(r[Col.B]): (int(r[Col.A]), int(r[Col.T_NS]), int(r[Col.X])) for r in records[code == Rec.ENQ_END]}
    roles = bucket_roles(records)
    calls = hook_calls(records)
    transfers = []
    for r in records[code == Rec.COMM_DONE]:
        seq = int(r[Col.B])
        if seq in issued:
            bucket, t0, nbytes = issued[seq]
            role = roles.get(seq, CommRole.PLAIN)
            transfers.append(_hooked(_Transfer(seq, bucket, bucket_name(bucket, role), t0, int(r[Col.T_NS]), f"comm thread {int(r[Col.X])}",
                                               nbytes, role=role, comm_kind=bucket_kind(role)), calls.get(seq), world))
    return _Comm("comm hook (issue to completion, includes queueing)", sorted(transfers, key=lambda t: t.seq), {}, [])


def kineto_comm(kpath: str, rank: int, world: int, records: np.ndarray, steps: list, warnings: list,
                dp_ranks: tuple[int, ...] = ()) -> _Comm:
    """Transfers as Kineto saw them on the gloo/NCCL lanes; all-reduces matched to hook buckets in issue order. ``dp_ranks``:
    DDP's group's ranks (a comm hook's all-gathers gather theirs); none recorded and no DDP bucket: the rank's one group
    pg_config describes as data parallel (a DP x TP job averaging its gradients itself over DeviceMesh's "dp" group ran
    them in {0,2} and {1,3}, read as one group of 4), else the job's."""
    from .kineto import read_kineto  # noqa: PLC0415  (only runs with Kineto on)

    kt = read_kineto(kpath, rank=rank, world=world)
    code = records[:, Col.CODE]
    told = () if dp_ranks or (code == Rec.ENQ_BEGIN).any() else described_dp_group(kt)
    dp_ranks = dp_ranks or told or tuple(range(world))
    dp = len(dp_ranks)
    warnings += kt.meta.warnings  # what its reader noticed (events dropped and counted) is said with the rank's own
    ev = kt.events
    lo, hi = steps[0][1], steps[-1][2]
    at = lambda us: kt.base_ns + int(round(us * 1e3))  # noqa: E731
    away = max(at(ev.start.min(initial=0.0)) - hi, lo - at(ev.end.max(initial=0.0))) if len(ev.start) else 0
    if away > SAME_JOB_SLACK_NS:  # no event near the rank's profiled steps: every collective would go unmatched
        raise DagprofError(f"recorded {away / 1e9:.0f} s away from rank {rank}'s profiled steps: another run's Kineto trace", kpath)
    colls = kt.meta.collectives.by_event() if kt.meta.collectives is not None else {}
    main = [j for j, lane in enumerate(kt.lanes) if lane.main]
    # the loop's own calls in the window (its transfer's seq, -1 where Kineto shows none; a kind unknown then: ``waited_after``)
    loop = np.flatnonzero((ev.kind == Kind.COMM_ENQUEUE) & (ev.depth == 0) & (ev.lane == main[0])) if main else np.zeros(0, np.int64)
    loop = [j for j in loop.tolist() if lo <= at(ev.start[j]) <= hi]
    later = waited_after(records, [(at(ev.start[j]), int(ev.seq[j])) for j in loop])
    if later:
        warnings.append(f"rank {rank}: {len(later)} collective(s) the script issued asynchronously in the window and waited for "
                        "after it left out (their transfer ran into the steps after the window, however far each rank's had got "
                        "when the profiler stopped)")
    gone = {q for q in later if q >= 0}  # the transfers Kineto shows of them (-1: none shown, nothing to leave out)
    idx = [i for i in np.flatnonzero(ev.kind == Kind.COMM).tolist() if lo <= at(ev.start[i]) <= hi and int(ev.seq[i]) not in gone]
    idx.sort(key=lambda i: ev.start[i])
    enq = sorted((int(r[Col.B]), int(r[Col.A]), int(r[Col.T_NS]), int(x[Col.X])) for r, x in
                 zip(records[code == Rec.ENQ_BEGIN], records[code == Rec.ENQ_END]))
    transfers, seq_of, used = [], {}, set()
    begin = exchange_starts(ev, idx)
    roles = bucket_roles(records)
    # a sparse gradient's bucket is gloo's sparse_all_reduce, a dense one's all_reduce: each matched in issue order to its own
    ops = {kind: [i for i in idx if colls.get(i) == kind] for kind in (CommKind.ALL_REDUCE, CommKind.SPARSE_ALL_REDUCE)}
    at_op = dict.fromkeys(ops, 0)
    calls, hook_ops = hook_calls(records), set()
    for n, (seq, bucket, t0, nbytes) in enumerate(enq):
        role = roles.get(seq, CommRole.PLAIN)
        kind = CommKind.SPARSE_ALL_REDUCE if role == CommRole.SPARSE else CommKind.ALL_REDUCE
        found, k = ops[kind], at_op[kind]
        while k < len(found) and (at(ev.start[found[k]]) < t0 or found[k] in used):
            k += 1
        mine = _hook_ops(calls[seq], idx, colls, used, ev, at) if seq in calls else None
        if (k == len(found) and seq not in calls) or (seq in calls and not mine):  # NCCL runs no kernel for a group of one rank
            if seq in calls and not calls[seq].issued:  # the user's hook skipped the bucket (issued nothing): no transfer to find
                skipped = sum(not calls[s].issued for s, *_ in enq if s in calls)
                warnings.append(f"rank {rank}: the comm hook issued no collective for later in {skipped} of its {len(enq)} bucket calls; "
                                "transfer spans from the hook")
            else:
                warnings.append(f"rank {rank}: Kineto shows {len(enq) - n} of the comm hook's {len(enq)} bucket calls' transfers nowhere "
                                "after their issue; transfer spans from the hook")
            comm = hook_comm(records, dp)
            comm.device = device_ops(kt, lo, hi, at)  # the GPU's work is Kineto's all the same
            return comm
        if seq in calls:  # the hook's own collectives: the transfer from the first it issued to the end of the last
            i, end = mine[0], max(ev.start[j] + ev.dur[j] for j in mine)
            hook_ops.update(int(ev.seq[j]) for j in mine)
        else:
            i, end = found[k], ev.start[found[k]] + ev.dur[found[k]]
            at_op[kind] = k + 1
            used.add(i)
        seq_of[seq] = int(ev.seq[i])
        lane = kt.lanes[ev.lane[i]]
        transfers.append(_hooked(_Transfer(int(ev.seq[i]), bucket, bucket_name(bucket, role), at(begin[i]), at(end), lane.name, nbytes,
                                           _comm_lane_kind(lane), role=role, comm_kind=bucket_kind(role)), calls.get(seq), dp))
    for i in idx:
        if i not in used:
            kind, lane = colls.get(i, CommKind.UNKNOWN), kt.lanes[ev.lane[i]]
            name = kind.label if kind else ev.name_of(i)  # by the collective its call ran, else by Kineto's name for it
            transfers.append(_Transfer(int(ev.seq[i]), -1, name, at(begin[i]), at(ev.start[i] + ev.dur[i]),
                                       lane.name, int(ev.nbytes[i]), _comm_lane_kind(lane), comm_kind=CommKind(int(ev.comm_kind[i]))))
    host = []
    kind_of = {int(ev.seq[i]): colls.get(i, CommKind.UNKNOWN) for i in idx}  # a host enqueue's kind: its transfer's
    hooked = set(seq_of.values()) | hook_ops | gone
    for j in loop:
        if ev.seq[j] >= 0 and int(ev.seq[j]) not in hooked:
            host.append(_Span(Kind.COMM_ENQUEUE, ev.name_of(j), at(ev.start[j]), at(ev.start[j] + ev.dur[j]), seq=int(ev.seq[j]),
                              comm_kind=CommKind(int(ev.comm_kind[j]))))
    host_calls = host
    host = [h for h in host if not _waited_later(records, kind_of.get(h.seq, CommKind.UNKNOWN), h.start)]
    kept = {h.seq for h in host}
    own_bytes = outside_sizes(records, lo, hi, [(kind_of.get(h.seq, CommKind.UNKNOWN), h.start, h.seq) for h in host])
    transfers = [replace(t, nbytes=own_bytes[t.seq]) if not t.nbytes and t.seq in own_bytes else t for t in transfers]
    inside = [i for i in idx if i not in used and int(ev.seq[i]) not in kept]
    unseen: dict[CommKind, UnseenCollective] = {}
    for i in inside:
        kind = colls.get(i, CommKind.UNKNOWN)
        u = unseen.get(kind, UnseenCollective())
        unseen[kind] = UnseenCollective(u.count + 1, u.us + float(ev.dur[i]))
    spans = [(colls.get(i, CommKind.UNKNOWN), at(ev.start[i]), at(ev.start[i] + ev.dur[i])) for i in inside]
    outside = [(kind_of.get(h.seq, CommKind.UNKNOWN), h.start) for h in host]
    sized = in_op_sizes(spans, records, lo, hi, outside, functional_waits(kt))
    hooked = {kt.lanes[ev.lane[i]].name: dp_ranks for i in used}
    if told:  # no DDP: the lanes of the collectives the script called itself (not inside an op) are its data-parallel group's
        hooked |= {t.lane: dp_ranks for t in transfers if t.seq in {h.seq for h in host_calls}}
    labelled = in_op_groups(kt, hooked, [(kt.lanes[ev.lane[i]].name, float(ev.dur[i]), b) for i, b in
                                         zip(inside, own_call_bytes(spans, records, lo, hi, outside))
                                         if colls.get(i, CommKind.UNKNOWN) not in P2P and colls.get(i) != CommKind.ALL_TO_ALL])
    return _Comm("Kineto (gloo/NCCL execution spans)", sorted(transfers, key=lambda t: t.seq), seq_of, host,
                 device_ops(kt, lo, hi, at), unseen, in_op=sized, in_op_groups=labelled, dp_ranks=told)


def _hook_ops(call: HookCall, idx: list[int], colls: dict, used: set[int], ev, at) -> list[int]:
    """Kineto's transfers of the collectives a comm hook of the job's own called for a bucket: each the first of its kind
    not yet taken that began after the call, in the call's order, all taken (``used``); the ones it issued for later are
    returned ([] where one is missing, or it issued none: its wire is then the hook's span)."""
    mine = []
    for kind, t, nbytes in sorted(call.issued + call.blocking, key=lambda c: c[1]):
        i = next((i for i in idx if i not in used and colls.get(i) == kind and at(ev.start[i]) >= t), None)
        if i is None:
            return []
        used.add(i)
        if (kind, t, nbytes) in call.issued:
            mine.append(i)
    return mine


def _waited_later(records: np.ndarray, kind: CommKind, start: int) -> bool:
    """Whether the job's collective enqueued outside any op at ``start`` (ns) is an asynchronous call of the model's that
    it waited for later (the latest call of its ``kind`` the collector recorded before it is a ``Rec.OWN_ASYNC`` with a
    ``Rec.OWN_WAIT``, and a layer's forward or backward of its step runs after it): a module's
    ``dist.all_gather_into_tensor(..., async_op=True)`` then ``work.wait()``. The thread blocked at that wait, inside the
    model's forward, so it is one of the model's own collectives (``in_op_sizes``), not a collective of its own that blocks
    its thread at once or is never waited for. One issued after the step's last layer (a script's own data parallelism:
    its per-parameter ``async_op=True`` all-reduces after ``backward()``, then each ``wait()``) is the loop's own, a
    collective of its own (``outside_sizes``)."""
    if kind not in OWN_KINDS:
        return False
    own = records[np.isin(records[:, Col.CODE], (Rec.OWN_COLL, Rec.OWN_ASYNC)) & (records[:, Col.A] == OWN_KINDS.index(kind))
                  & (records[:, Col.T_NS] <= start)]
    if not len(own):
        return False
    last = own[np.argmax(own[:, Col.T_NS])]
    waits = records[(records[:, Col.CODE] == Rec.OWN_WAIT) & (records[:, Col.A] == last[Col.A])]
    return bool(last[Col.CODE] == Rec.OWN_ASYNC and (waits[:, Col.X] == last[Col.T_NS]).any() and _layers_after(records, int(last[Col.T_NS])))


def waited_after(records: np.ndarray, calls: list[tuple[int, int]]) -> list[int]:
    """The seqs of ``calls`` (enqueue start ns, seq: the loop's own calls in the window, -1 where Kineto shows no transfer)
    that are asynchronous calls of the script's own waited for after the window: the call the collector recorded last
    before it is a ``Rec.OWN_ASYNC`` with no ``Rec.OWN_WAIT``, in a file that records waits of its kind.
    Which of them Kineto shows depends on how far each rank's gloo thread had got when the profiler stopped: a
    hand-sharded Adam's last all-gather, issued at the end of the window's last step and waited for before the next
    forward (``bench/hand_dp/gru_sharded_adam.py``), was on one rank's trace and not the other's, and the run was refused
    ("missing on rank(s) [1]"), or read on neither without a word. Its wait lies in a step after the window on every rank
    alike (the program's order), so it is left out on every rank alike, and said."""
    code = records[:, Col.CODE]
    own, waits = records[np.isin(code, (Rec.OWN_COLL, Rec.OWN_ASYNC))], records[code == Rec.OWN_WAIT]
    out = []
    for t, seq in calls:
        before = own[own[:, Col.T_NS] <= t]
        last = before[np.argmax(before[:, Col.T_NS])] if len(before) else None
        if (last is not None and last[Col.CODE] == Rec.OWN_ASYNC and (waits[:, Col.A] == last[Col.A]).any()
                and not (waits[:, Col.X] == last[Col.T_NS]).any()):
            out.append(seq)
    return out


def _layers_after(records: np.ndarray, t: int) -> bool:
    """Whether a layer's forward or backward record follows ``t`` (ns) before its step's end."""
    t_ns, code = records[:, Col.T_NS], records[:, Col.CODE]
    ends = t_ns[(code == Rec.STEP_END) & (t_ns >= t)]
    until = ends.min() if len(ends) else np.iinfo(np.int64).max
    return bool((np.isin(code, (Rec.FWD_BEGIN, Rec.FWD_END, Rec.BWD_BEGIN, Rec.BWD_END)) & (t_ns > t) & (t_ns <= until)).any())


def _own_calls(records: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The model's calls the collector sized (``Rec.OWN_COLL``, ``Rec.OWN_ASYNC``) in the window ``[lo, hi]``, by time."""
    window = (records[:, Col.T_NS] >= lo) & (records[:, Col.T_NS] <= hi)
    own = records[np.isin(records[:, Col.CODE], (Rec.OWN_COLL, Rec.OWN_ASYNC)) & window]
    return own[np.argsort(own[:, Col.T_NS], kind="stable")]


def _claim_outside(calls: np.ndarray, starts: list[int]) -> tuple[np.ndarray, list[np.ndarray | None]]:
    """Each call outside any op (enqueued at ``starts``, ns, sorted, one kind's) takes the latest of that kind's ``calls``
    before it, the last call first: (the calls left for the ops, each start's record or None). The last first, so that
    records written together before their calls (DDP's buffer broadcasts, one per dtype) go to them in order."""
    claimed: list[np.ndarray | None] = []
    for t in reversed(starts):
        before = np.flatnonzero(calls[:, Col.T_NS] <= t)
        claimed.insert(0, calls[before[-1]] if len(before) else None)
        calls = np.delete(calls, before[-1], axis=0) if len(before) else calls
    return calls, claimed


def outside_sizes(records: np.ndarray, lo: int, hi: int, outside: list[tuple[CommKind, int, int]]) -> dict[int, int]:
    """seq -> bytes (``CommKind.event_bytes``) of the job's calls outside any op (``outside``: kind, enqueue start, seq),
    which Kineto shows as collectives of their own without their size: a logging ``dist.all_reduce`` of the loss, a
    script's own data-parallel ``async_op=True`` all-reduces; the record each claims (``_claim_outside``)."""
    own, out = _own_calls(records, lo, hi), {}
    for k, kind in enumerate(OWN_KINDS):
        mine = sorted((t, seq) for name, t, seq in outside if name == kind)
        for (_, seq), rec in zip(mine, _claim_outside(own[own[:, Col.A] == k], [t for t, _ in mine])[1]):
            if rec is not None:
                out[seq] = kind.event_bytes(int(rec[Col.X]), int(rec[Col.B]))
    return out


FUNCTIONAL_WAIT = "_c10d_functional::wait_tensor"  # the op every wait on a functional collective runs, wherever called from


def functional_waits(kt: RankTrace) -> np.ndarray:
    """(start, end) ns of each ``_c10d_functional::wait_tensor`` op Kineto saw, by start: where a thread blocked on a
    functional collective, also where the collector's patched ``wait_tensor`` was not the caller (``in_op_sizes``)."""
    ev = kt.events
    if FUNCTIONAL_WAIT not in ev.names:
        return np.zeros((0, 2), np.int64)
    i = np.flatnonzero(ev.name == ev.names.index(FUNCTIONAL_WAIT))
    start = kt.base_ns + np.round(ev.start[i] * 1e3).astype(np.int64)
    out = np.stack([start, start + np.round(ev.dur[i] * 1e3).astype(np.int64)], axis=1)
    return out[np.argsort(out[:, 0], kind="stable")]


def in_op_sizes(inside: list[tuple[CommKind, int, int]], records: np.ndarray, lo: int, hi: int,
                outside: list[tuple[CommKind, int]] = (), held: np.ndarray | None = None) -> list[_InOp]:
    """The collectives Kineto shows inside the model's ops (``inside``: kind, transfer start and end, ns, in issue
    order) that the collector sized (``Rec.OWN_COLL``, ``Rec.OWN_ASYNC``, in the window ``[lo, hi]``), matched by kind in
    issue order. The job's calls outside any op (``outside``: kind, enqueue start; a logging all-reduce, which Kineto shows
    as a collective of its own) each take the latest record of their kind before them out of the pairing. A kind whose
    calls and transfers then do not pair one to one (a call by a path the collector does not patch) is left unsized: timed
    inside its op as measured, and counted so. A blocking call blocked its thread from its transfer's start; an
    asynchronous one from its first wait (``Rec.OWN_WAIT``) on, so its piece starts there, and one whose transfer ended
    before that wait began (hidden behind the ops between) or that no wait was recorded for stays unsized likewise.
    ``held`` (``functional_waits``): Kineto's ``wait_tensor`` ops; one that waited for the call (``_held_from``) is where it
    blocked, where earlier than its recorded wait. DTensor's backward waits through C++ (no
    patched function): on ``bench/tp_fresh/llama_fsdp_tp.py`` at 200 Mbit/s such a wait held the end of 255 of 272
    functional all-reduces, the recorded wait 174 (the rest came 0.3-0.5 ms after the end), 4.9 ms of 8.0 blocked a call."""
    waits = {(int(r[Col.A]), int(r[Col.X])): int(r[Col.T_NS]) for r in records[records[:, Col.CODE] == Rec.OWN_WAIT]}
    pairs = own_pairs(inside, records, lo, hi, outside)
    held_from = _held_from(pairs, inside, np.zeros((0, 2), np.int64) if held is None else held)
    out = []
    for k, (i, c) in enumerate(pairs):
        kind, t0, t1 = inside[i]
        waited = min(waits.get((OWN_KINDS.index(kind), int(c[Col.T_NS])), t1), held_from.get(k, t1))
        blocked = t0 if c[Col.CODE] == Rec.OWN_COLL else max(t0, waited)
        if blocked < t1:
            out.append(_InOp(kind, blocked, t1, kind.event_bytes(int(c[Col.X]), int(c[Col.B])), int(c[Col.B])))
    return sorted(out, key=lambda x: x.start)


def _held_from(pairs: list[tuple[int, np.ndarray]], inside: list[tuple[CommKind, int, int]], held: np.ndarray) -> dict[int, int]:
    """Per pair (its index in ``pairs``), where the first of ``held`` (Kineto's waits, ``functional_waits``) that waited for
    it began: a wait begun after the call and before the transfer's end, that lasted to it, is the wait for the one of
    those transfers that ended last (the one it returned for: another that ended within it ended while the thread waited
    for that one, hidden as it would have been)."""
    calls = np.array([int(c[Col.T_NS]) for _, c in pairs], np.int64)
    ends = np.array([inside[i][2] for i, _ in pairs], np.int64)
    out: dict[int, int] = {}
    for s, e in held.tolist():
        on = np.flatnonzero((calls <= s) & (ends >= s) & (ends <= e))
        if len(on):
            k = int(on[np.argmax(ends[on])])
            out[k] = min(out.get(k, s), s)
    return out


def own_pairs(inside: list[tuple[CommKind, int, int]], records: np.ndarray, lo: int, hi: int,
              outside: list[tuple[CommKind, int]] = ()) -> list[tuple[int, np.ndarray]]:
    """(index into ``inside``, the record the collector wrote for its call) of each collective Kineto shows inside the
    model's ops that pairs with a recorded call (``in_op_sizes``: by kind in issue order, a kind all or none)."""
    own = _own_calls(records, lo, hi)
    out = []
    for k, kind in enumerate(OWN_KINDS):
        calls = _claim_outside(own[own[:, Col.A] == k], sorted(t for name, t in outside if name == kind))[0]
        seen = [i for i, (name, _, _) in enumerate(inside) if name == kind]
        if not len(calls) or len(calls) != len(seen) or any(int(c[Col.T_NS]) > inside[i][2] for c, i in zip(calls, seen)):
            continue
        out += list(zip(seen, calls))
    return out


def own_call_bytes(inside: list[tuple[CommKind, int, int]], records: np.ndarray, lo: int, hi: int,
                   outside: list[tuple[CommKind, int]] = ()) -> list[int]:
    """The bytes (``CommKind.event_bytes``) of each of ``inside`` whose call the collector recorded (``own_pairs``), 0 for
    the others: for the breakdown by dimension (``in_op_groups``), also where the transfer ended before its wait began."""
    out = [0] * len(inside)
    for i, c in own_pairs(inside, records, lo, hi, outside):
        out[i] = inside[i][0].event_bytes(int(c[Col.X]), int(c[Col.B]))
    return out


def exchange_starts(ev, idx: list[int]) -> dict[int, float]:
    """Where each collective ``idx`` (Kineto's events) starts its exchange, us: after the device syncs it opens with.

    gloo's collective of CUDA tensors copies them to the host on a side stream (launched by the caller after the tensors'
    kernels) and its worker first synchronizes that stream: the op's leading ``cudaStreamSynchronize`` calls wait for the
    GPU, not the wire. On the 2-rank H200 DDP run (gloo, both ranks on one GPU, Kineto) that wait was 1.5-34 ms of the
    first bucket or two each step (the GPU still running backward; 257 of rank 0's 1940 ms of gloo ops), and as transfer
    time the link fitted to the buckets' total spread it over every bucket, the last one after backward too: the model
    +2.5 % off its replay, +1.9 % with the wait left out. The wait stays before the transfer, in the gap the
    collective's join keeps as measured. An op without such calls inside (NCCL's kernels, gloo on CPU tensors) starts
    where it starts."""
    out = {i: float(ev.start[i]) for i in idx}
    for lane in {int(ev.lane[i]) for i in idx}:
        inner = np.flatnonzero((ev.lane == lane) & (ev.depth > 0))
        inner = inner[np.argsort(ev.start[inner], kind="stable")]
        starts = ev.start[inner]
        for i in (i for i in idx if ev.lane[i] == lane):
            end = ev.start[i] + ev.dur[i]
            for j in inner[int(np.searchsorted(starts, ev.start[i], side="left")):].tolist():
                if ev.start[j] > end or ev.kind[j] not in (Kind.COMM_WAIT, Kind.RUNTIME):
                    break
                if ev.kind[j] == Kind.COMM_WAIT:
                    out[i] = float(ev.start[j] + ev.dur[j])
    return out


def device_ops(kt: RankTrace, lo: int, hi: int, at) -> list[_DeviceOp]:
    """GPU compute and copies launched inside the window, with the host calls that launched them and waited for them."""
    ev = kt.events
    gpu = np.array([lane.kind == LaneKind.GPU_STREAM for lane in kt.lanes], dtype=bool)
    if not gpu.any():
        return []
    on_gpu = gpu[ev.lane]
    span = lambda j: (at(ev.start[j]), at(ev.start[j] + ev.dur[j]))  # noqa: E731
    launch: dict[int, tuple[int, int]] = {}
    sync: dict[int, tuple[int, int, Dep]] = {}
    for (src, dst), rule in zip(kt.flows.tolist(), kt.rules().tolist()):
        if on_gpu[dst] and not on_gpu[src]:
            launch[dst] = span(src)
        elif on_gpu[src] and not on_gpu[dst]:
            sync.setdefault(src, (*span(dst), Dep(rule) if rule != Dep.AFTER else Dep.SYNC))
    ops = []
    for i in np.flatnonzero(on_gpu & (ev.kind != Kind.COMM) & (ev.depth == 0)).tolist():
        called, waited = launch.get(i, (-1, -1)), sync.get(i, (-1, -1, Dep.SYNC))
        if lo <= (called[0] if called[0] >= 0 else at(ev.start[i])) <= hi:
            ops.append(_DeviceOp(ev.name_of(i), Kind(int(ev.kind[i])), *span(i), kt.lanes[ev.lane[i]].name, *called, *waited))
    return ops


def _comm_lane_kind(lane: Lane) -> LaneKind:
    return LaneKind.GPU_STREAM if lane.kind == LaneKind.GPU_STREAM else LaneKind.COMM_THREAD
