"""FSDP2 rank files (``RankFile.fsdp``, written by ``collect.hooks.fsdp``) -> the spans and transfers of ``run_rank``.

Each collective FSDP called (all-gather before a unit's forward or backward, reduce-scatter after
its backward, HSDP's all-reduce across replicas) is on the main lane an enqueue span from the call
to its transfer's start; the rest of the call, where the thread blocked, is the gap ``run_rank``
turns into the wait on that transfer ("blocked on a collective"). So a unit's forward starts after
its all-gather's wait, and the replay holds it there until the all-gather is done. The copy-out
after an all-gather and each reshard are OTHER spans of their own (named by unit), so that wait
ends where the call returned.

Transfers: with Kineto, the gloo op (on a ``pt_gloo_runloop`` thread) that started inside the call
(gloo runs FSDP's reduce-scatter as an all-reduce of the whole gradient: the transfer is named as
FSDP called it); without, the call's own span. The job's own collectives the collector recorded (``DTensor.full_tensor``
gathers, blocking c10d calls such as DCP's) are transfers too, of no unit; those Kineto shows outside every recorded call
(clip_grad_norm_'s functional all-reduce) are counted in a warning: they stay host time, labelled by group for the
breakdown by dimension (``parallelism.in_op_groups``). ``seq`` is the collective's index in issue order
over the window (equal on every rank of the job: each issues the same sequence), its group is
named by its ranks ("0,1"), so HSDP's shard and replicate groups stay apart.
"""
from __future__ import annotations

import bisect
import math
import os
from collections import Counter

import msgspec
import numpy as np

from ..errors import DagprofError
from ..intervals import covered
from .events import CommKind, CommRole, EventRows, EventTable, Kind, RankTrace
from .meta import Collectives, OptimizerOps
from .parallelism import OPTIMIZER_STEP, in_op_groups
from .run_comm import device_ops, exchange_starts, functional_waits, in_op_sizes, own_call_bytes
from .run_schema import FSDP1_API, FSDP2_API, FSDP_ROOT, FULL_TENSOR, JOB_CALL, JOB_PHASES, Col, FsdpCollective, FsdpInfo, Rec
from .run_spans import _Comm, _DeviceOp, _Span, _Transfer

DTENSOR_DISPATCH = "PythonSubclass"  # the profiler's range around a tensor subclass's __torch_dispatch__ (DTensor's ops)
HOOK_LANE = "fsdp collective (hook span)"


def fsdp_comm(info: FsdpInfo, kpath: str | None, rank: int, world: int, records: np.ndarray, steps: list, warnings: list) -> _Comm:
    """The transfers and host spans of every FSDP collective in the profiled steps."""
    code, a, t = records[:, Col.CODE], records[:, Col.A], records[:, Col.T_NS]
    begin = {int(i): int(s) for i, s in zip(a[code == Rec.FSDP_COLL_BEGIN], t[code == Rec.FSDP_COLL_BEGIN])}
    end = {int(i): int(s) for i, s in zip(a[code == Rec.FSDP_COLL_END], t[code == Rec.FSDP_COLL_END])}
    lo, hi = steps[0][1], steps[-1][2]
    calls = sorted((k, begin[k], end[k]) for k in begin if k in end and lo <= begin[k] <= hi)
    gloo, device, optimizer, kt = _kineto_transfers(kpath, rank, world, lo, hi, warnings) if kpath else (None, [], None, None)
    if gloo is not None and len(gloo) < len(calls):
        warnings.append(f"rank {rank}: Kineto shows {len(gloo)} collectives for {len(calls)} FSDP calls; transfer spans from the hooks")
        gloo = None
    transfers, host = [], []
    found = _call_transfers(info, calls, gloo) if gloo is not None else [None] * len(calls)
    hooked: dict[str, tuple[int, ...]] = {}  # lane -> the group of FSDP's calls whose transfers ran on it
    for (k, b0, b1), j in zip(calls, found):
        c = info.collectives[k]
        name = collective_name(info, c)
        lane, s0, x0, s1 = HOOK_LANE, b0, b0, b1
        if j is not None:
            lane, s0, x0, s1, _ = gloo[j]
            if c.phase not in JOB_PHASES:  # FSDP's own: data parallel
                hooked.setdefault(lane, tuple(int(r) for r in c.group.split(",")))
        kind, role = CommKind.from_label(c.kind).priced_as, CommRole.JOB if c.phase in JOB_PHASES else CommRole.PLAIN
        transfers.append(_Transfer(k, -1, name, x0, s1, lane, c.nbytes, comm_kind=kind, role=role))
        # at least 1 ns: a span that ends where the previous one was cut would be dropped as already covered
        host.append(_Span(Kind.COMM_ENQUEUE, f"fsdp {name}", b0, max(b0 + 1, min(s0, b1)), layer=-1, seq=k, nbytes=c.nbytes,
                          comm_kind=kind, role=role))
    labelled, sized = [], []
    taken = set(found)
    if gloo is not None and (outside := [x for j, x in enumerate(gloo) if j not in taken]):  # each collective Kineto saw outside FSDP's calls
        # the job's functional collectives (a TP layer's all-reduces) the collector sized: pieces of the ops they blocked,
        # which link what-ifs re-price as a DDP job's (``run_comm.in_op_sizes``)
        spans = [(x[4], x[1], x[3]) for x in outside]
        sized = in_op_sizes(spans, records, lo, hi, held=functional_waits(kt))
        nbytes = own_call_bytes(spans, records, lo, hi)
        # no rank in the text: every rank of the job runs the same ones, and equal texts are shown once (``warnings_of``)
        warnings.append(_outside_text([x[1] for x in outside], records, steps, info.api, len(sized)))
        labelled = in_op_groups(kt, hooked, [(x[0], (x[3] - x[1]) / 1e3, b) for x, b in zip(outside, nbytes)])
    _say_job_steps(info, calls, steps, records, warnings)
    if (untimed := untimed_roots_text(info.units)):
        warnings.append(untimed)
    for kb, what in ((Rec.FSDP_COPY_OUT_BEGIN, "copy-out"), (Rec.FSDP_RESHARD_BEGIN, "reshard")):
        rows = np.flatnonzero((code == kb) | (code == kb + 1))
        opened: dict[tuple[int, int], int] = {}
        for i in rows.tolist():
            key = (int(a[i]), int(records[i, Col.B]))
            if code[i] == kb:
                opened[key] = int(t[i])
            elif key in opened and lo <= opened[key] <= hi:
                phase = "forward" if key[1] == 0 else "backward"
                host.append(_Span(Kind.OTHER, f"fsdp {what} {info.units[key[0]].name} ({phase})", opened.pop(key), int(t[i])))
    source = "Kineto (gloo execution spans) + FSDP hooks" if gloo is not None else "FSDP hooks (call spans: the transfer and waiting for peers)"
    return _Comm(source, sorted(transfers, key=lambda x: x.seq), {}, sorted(host, key=lambda s: s.start), device, optimizer=optimizer,
                 in_op=sized, in_op_groups=labelled)


def _call_transfers(info: FsdpInfo, calls: list[tuple[int, int, int]], gloo: list[tuple]) -> list[int | None]:
    """The index into ``gloo`` (Kineto's collectives, by start) of each call's transfer (None: none found): the first not
    taken that started within the call. A process group runs its collectives on gloo threads of its own, which share them
    about evenly, so those of the call's group are the lanes where that group's calls found their transfer that way at
    more than a quarter as often as on its most found one (and more often than another group's calls); a second pass keeps to
    them, a call it leaves without one keeping the first pass's where no other call took it (a job's rare call in another
    process group of the same ranks, whose lane few calls found). Without it, a DP x TP job's tensor-parallel all-reduce,
    issued asynchronously before an FSDP call and started on its group's thread within it, was taken as the call's
    (``bench/tp_fresh/llama_fsdp_tp.py``: on 2 of its 4 ranks), and its group's lanes labelled data parallel."""
    first = _first_within(calls, gloo, lambda k, lane: True)
    votes = Counter((info.collectives[k].group, gloo[j][0]) for (k, _, _), j in zip(calls, first) if j is not None)
    most: Counter = Counter()
    for (group, _), n in votes.items():
        most[group] = max(most[group], n)
    lanes: dict[str, set[str]] = {}
    for (group, lane), n in votes.items():
        if 4 * n > most[group] and all(n > m for (other, at), m in votes.items() if at == lane and other != group):
            lanes.setdefault(group, set()).add(lane)
    second = _first_within(calls, gloo, lambda k, lane: lane in lanes.get(info.collectives[k].group, ()))
    taken = set(second)
    return [j if j is not None or i in taken else i for j, i in zip(second, first)]


def _first_within(calls: list[tuple[int, int, int]], gloo: list[tuple], fits) -> list[int | None]:
    """For each call in order, the first of ``gloo`` not yet taken that started within it on a lane ``fits(call, lane)``."""
    starts = [x[1] for x in gloo]
    taken: set[int] = set()
    out: list[int | None] = []
    for k, b0, b1 in calls:
        j = bisect.bisect_left(starts, b0)
        while j < len(gloo) and starts[j] <= b1 and (j in taken or not fits(k, gloo[j][0])):
            j += 1
        hit = j if j < len(gloo) and starts[j] <= b1 else None
        out.append(hit)
        taken.add(hit)
    return out


def _outside_text(starts: list[int], records: np.ndarray, steps: list, api: str = FSDP2_API, sized: int = 0) -> str:
    """The warning for the collectives a rank ran outside FSDP's calls (``starts``: each one's start, ns), told apart by
    where they ran: within a step's forward and backward passes (from its first layer's forward to its last layer's
    backward) they are the model's own (a DP x TP job's tensor-parallel all-reduces: bench/tp_fresh/t5_dp_tp.py ran about
    30 a step, once all told as clipping and saves), before or after them the job's (clipping, saves, logging). FSDP1 has no
    DTensor: its own ``clip_grad_norm_`` all-reduces the norm (``bench/fsdp_fresh/fsdp1_sgo_frozen.py``, once a step).
    Between a backward and the next forward of one step (the last layer record before it a backward's end, the next one
    the forward of the step's first layer: a checkpointed block's recompute in backward starts at that block) a collective
    is the loop's, not the model's: SAM's gradient norm between its two passes (``bench/fsdp_fresh/sam_convnext.py``, once
    told as a tensor-parallel all-reduce or SyncBatchNorm's statistics).
    ``sized``: those of them whose bytes the collector recorded (DTensor's functional collectives), pieces of the ops they
    blocked that link what-ifs re-price (``run_comm.in_op_sizes``)."""
    clip = "FSDP1's clip_grad_norm_ (its all-reduce of the norm)" if api == FSDP1_API else "clip_grad_norm_'s on DTensor gradients"
    layer_t, layer_fwd, layer_id = _layer_records(records)
    passes = _passes(layer_t, steps)
    within = np.array([any(a <= x <= b for a, b in passes) for x in starts], dtype=bool)
    between = np.zeros(len(starts), dtype=bool)
    if within.any():  # then a pass holds layer records
        first = [int(f[0]) for a, _ in passes if len(f := layer_id[(layer_t >= a) & layer_fwd])]  # each step's first layer forward
        at = np.minimum(np.searchsorted(layer_t, np.asarray(starts, dtype=np.int64)), len(layer_t) - 1)  # the next layer record
        between = within & layer_fwd[at] & np.isin(layer_id[at], first) & ~layer_fwd[np.maximum(at - 1, 0)]
    inside, loop = int(within.sum() - between.sum()), int(between.sum())
    parts = [f"{inside} within the forward and backward passes (the model's own: a tensor-parallel layer's all-reduce, SyncBatchNorm's "
             "statistics; what-ifs of data parallelism leave them as they are)"] * bool(inside)
    parts += [f"{loop} between a backward and the next forward of one step (the loop's own, as a model run twice a step does: SAM's "
              "gradient norm; what-ifs of data parallelism leave them as they are)"] * bool(loop)
    inside += loop
    parts += [f"{len(starts) - inside} before or after them (the job's own: {clip}, a dist.all_reduce "
              "of ignored parameters' gradients or of a loss through the functional collectives; DTensor.full_tensor's and blocking "
              "torch.distributed calls such as DCP's are recorded)"] * (len(starts) > inside)
    # no count: how many blocked their op (were not over before their wait) differs from rank to rank
    priced = ("; link what-ifs re-price those whose bytes were recorded (DTensor's functional collectives) where they blocked "
              "their op, their price on the profiled link replaced by the new one") if sized else ""
    return (f"{len(starts)} collective(s) a rank ran in the profiled steps outside FSDP's calls ({'; '.join(parts)}) are kept as "
            "measured host time, their waits for peers included: " + ("not held to their peers in replay and what-ifs" + priced
                                                                       if sized else "not priced by the link nor held to their peers in replay and what-ifs"))


def _layer_records(records: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The layers' forward-begin and backward-end records by time: their times, whether each is a forward, their layers."""
    code, t = records[:, Col.CODE], records[:, Col.T_NS]
    layer = (code == Rec.FWD_BEGIN) | (code == Rec.BWD_END)
    order = np.argsort(t[layer], kind="stable")
    return t[layer][order], (code[layer] == Rec.FWD_BEGIN)[order], records[layer, Col.A][order]


def _passes(layer_t: np.ndarray, steps: list) -> list[tuple[int, int]]:
    """Each step's forward and backward passes: from its first layer record to its last (ns)."""
    return [(int(w.min()), int(w.max())) for _, b0, b1 in steps if len(w := layer_t[(layer_t >= b0) & (layer_t <= b1)])]


def _job_call_where(starts: list[int], records: np.ndarray, steps: list) -> str:
    """Where the job's own blocking calls ran, which is all the record tells of them: within a step's passes (the model's
    or its loss's: an HSDP dual encoder's differentiable all_gather of in-batch negatives and its backward's scatters were
    once guessed an evaluation's or a DCP save's) or outside them (the loop's: a save, an evaluation, a metric). The passes
    are the training's: forwards under ``torch.no_grad`` do not open them, or an evaluation's metric all-reduce after its
    forwards, in the step the training's forward follows, was said the model's (``bench/fsdp_fresh/ft_transformer.py``,
    ``hsdp_pointnet2.py``)."""
    evaluation = (records[:, Col.CODE] == Rec.FWD_BEGIN) & (records[:, Col.X] == 1)
    passes = _passes(_layer_records(records[~evaluation])[0], steps)
    inside = sum(any(a <= x <= b for a, b in passes) for x in starts)
    parts = [f"{inside} during the forward and backward passes (the model's or its loss's own)"] * bool(inside)
    parts += [f"{len(starts) - inside} outside them (the loop's own)"] * (len(starts) > inside)
    return "; ".join(parts) + "; which call issued them the record cannot tell"


def _say_job_steps(info: FsdpInfo, calls: list[tuple[int, int, int]], steps: list, records: np.ndarray, warnings: list) -> None:
    """Say which profiled steps ran collectives of the job's own (``JOB_PHASES``: DTensors gathered for a state_dict, a DCP
    save's object collectives): they are in the window's mean iteration, which a job saving every k steps takes 1 in k
    times, not as often as the window holds them. Where every step ran them they are the loop's own (DINO's all-reduce
    of its teacher's centre, ``bench/fsdp_fresh/dino_ema_teacher.py``), and no ``--steps`` leaves them out."""
    for phase, what, priced in ((FULL_TENSOR, "DTensor.full_tensor gathers (a state_dict for a save?)", "all-gathers"),
                                (JOB_CALL, "blocking torch.distributed calls of the job's own ({kinds}: {where})", "the collectives they run")):
        found = [(s, info.collectives[k].kind, t) for s, b0, b1 in steps for k, t, _ in calls
                 if info.collectives[k].phase == phase and b0 <= t <= b1]
        ran = [kind for _, kind, _ in found]
        hit = {s: n for s, _, _ in steps if (n := sum(x[0] == s for x in found))}
        if hit:  # no rank in the text: every rank runs them in the same steps, and equal texts are shown once
            starts = [t for _, _, t in found]
            what = what.format(kinds=", ".join(f"{ran.count(k)} {k}" for k in sorted(set(ran))), where=_job_call_where(starts, records, steps))
            apart = ("every step ran them: no window leaves them out" if len(hit) == len(steps) else "--template averages those steps only with each "
                     "other; a window without them (--steps) times training alone")
            warnings.append(f"{len(hit)} of {len(steps)} profiled steps (step {', '.join(map(str, hit))}) ran {sum(hit.values())} "
                            f"{what}: joined across ranks and priced by the link as {priced}, they and the host time around them count "
                            f"in the window's mean iteration and every what-if as {len(hit)} step(s) in {len(steps)}; {apart}")


def untimed_roots(units: list) -> list[str]:
    """Per unit, the class of its ``fully_shard`` root where the collector did not attach that root (``FsdpUnit.untimed_root``;
    in a file from before that field, a unit named as an earlier one is another root's: "a root's class not recorded"), else ""."""
    if any(u.untimed_root for u in units):
        return [u.untimed_root for u in units]
    names = [u.name for u in units]
    return ["a root's class not recorded" if u.name in names[:k] else "" for k, u in enumerate(units)]


def untimed_roots_text(units: list) -> str:
    """One line on the units of roots the collector did not attach ("" if none): their compute is in no layer."""
    roots = untimed_roots(units)
    foreign = [u for u, r in zip(units, roots) if r]
    if not foreign:
        return ""
    return (f"{len(foreign)} FSDP units of {max(1, sum(u.name == FSDP_ROOT for u in foreign))} fully_shard root(s) besides the "
            f"profiled model ({', '.join(sorted(set(filter(None, roots))))}) ran untimed: their all-gathers and reduce-scatters are "
            "kept, but their forward and backward compute shows as 'forward between timed layers' and 'other', and what-ifs that "
            "re-lay units refuse (dagprof.profile(model=...) times that model alone; `dagprof profile -- torchrun ...` every root)")


def collective_name(info: FsdpInfo, c: FsdpCollective) -> str:
    """Its node's name: ``"<kind> <unit>[ (prefetched by <unit>)]"`` (``graph.build_fsdp.fsdp_collectives`` reads the
    unit back), or for the job's own ``full_tensor`` gather ``"full_tensor all_gather"`` and its own calls
    ``"job <kind>[ (<call>)]"`` (``CommKind.priced_as``: ``"job all_gather (gather)"``), each ``CommRole.JOB``: the FSDP passes
    (reshard, units, mesh) leave them as they are, and the link model prices each as the kind it names first."""
    if c.phase == FULL_TENSOR:
        return f"{FULL_TENSOR} {c.kind}"
    if c.phase == JOB_CALL:
        priced = CommKind.from_label(c.kind).priced_as.label
        return f"{JOB_CALL} {priced}" + (f" ({c.kind})" if priced != c.kind else "")
    return f"{c.kind} {info.units[c.unit].name}" + (f" (prefetched by {info.units[c.prefetched_by].name})" if c.prefetched_by >= 0 else "")


def _kineto_transfers(kpath: str, rank: int, world: int, lo: int, hi: int, warnings: list
                      ) -> tuple[list[tuple[str, int, int, int, CommKind]], list[_DeviceOp], OptimizerOps | None, RankTrace]:
    """(lane, start ns, its exchange's start ns (``run_comm.exchange_starts``), end ns, kind) of every collective Kineto saw in
    [lo, hi], by start, the GPU's kernels and copies launched in it, its optimizer steps' ops (``optimizer_ops``) and the trace;
    what the trace's reader noticed (events dropped and counted) joins ``warnings``. The start matches the op to the
    FSDP call it served; its transfer starts at the other."""
    from .kineto import read_kineto  # noqa: PLC0415  (only runs with Kineto on)

    kt = read_kineto(kpath, rank=rank, world=world)
    warnings += kt.meta.warnings
    ev = kt.events
    at = lambda us: kt.base_ns + int(round(us * 1e3))  # noqa: E731
    idx = [i for i in np.flatnonzero(ev.kind == Kind.COMM).tolist() if lo <= at(ev.start[i]) <= hi]
    begin = exchange_starts(ev, idx)
    colls = kt.meta.collectives.by_event() if kt.meta.collectives is not None else {}
    out = [(kt.lanes[ev.lane[i]].name, at(ev.start[i]), at(begin[i]), at(ev.start[i]) + int(round(ev.dur[i] * 1e3)),
            colls.get(i, CommKind.UNKNOWN)) for i in idx]
    return (sorted(out, key=lambda x: x[1]), device_ops(kt, lo, hi, at), optimizer_ops(ev, _within(kt.base_ns + np.round(ev.start * 1e3), lo, hi)),
            kt)


def _within(t_ns: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return (t_ns >= lo) & (t_ns <= hi)


def optimizer_ops(ev: EventTable, window: np.ndarray) -> OptimizerOps | None:
    """The optimizer steps (``Optimizer.step#``) among the events in ``window``: their time and, of it, the ops run under
    DTensor's dispatches, the union of what those dispatches hold on the step's thread (an op inside another counted
    once). FSDP2 steps every parameter as a DTensor: each op goes through its dispatch (a fixed cost per op, so per
    tensor) to the same op on the local shard (its bytes: 1/shard of the parameter's); the steps' other time (the
    dispatches' own, the Python between the ops, plain tensors' ops) does not shrink with the shard (``passes.fsdp_mesh.
    step_scale``). None where the window holds no step."""
    step_ids = [k for k, n in enumerate(ev.names) if n.startswith(OPTIMIZER_STEP)]
    steps = np.flatnonzero(np.isin(ev.name, step_ids) & window).tolist()
    if not steps:
        return None
    end = ev.start + ev.dur
    dispatch = ev.names.index(DTENSOR_DISPATCH) if DTENSOR_DISPATCH in ev.names else -1
    local = 0.0
    dispatches = 0
    for i in steps:
        inside = np.flatnonzero((ev.lane == ev.lane[i]) & (ev.start >= ev.start[i]) & (end <= end[i]))
        d = inside[ev.name[inside] == dispatch]
        d = d[np.argsort(ev.start[d], kind="stable")]
        outer = d[ev.start[d] >= np.concatenate([[-np.inf], np.maximum.accumulate(end[d])[:-1]])] if len(d) else d  # not nested
        dispatches += len(outer)
        ops = inside[ev.name[inside] != dispatch]
        k = np.searchsorted(ev.start[outer], ev.start[ops], side="right") - 1
        held = ops[(k >= 0) & (end[ops] <= end[outer][np.maximum(k, 0)])] if len(outer) else ops[:0]
        local += covered(ev.start[held], end[held])
    return OptimizerOps(steps=len(steps), us=float(ev.dur[steps].sum()), local_us=local, dispatches=dispatches)


def label_groups(rows: EventRows, info: FsdpInfo) -> tuple[list[str], dict[str, list[int]], Collectives]:
    """Name each FSDP collective's process group by its ranks (the groups, their ranks) and record its kind (for
    matching); each wait is named by the collective it waited for ("wait all_gather blocks.0")."""
    cols = rows.columns()
    groups = sorted({c.group for c in info.collectives})
    index = {gname: k for k, gname in enumerate(groups)}
    coll = Collectives()
    for i in np.flatnonzero(cols["seq"] >= 0).tolist():
        c = info.collectives[int(cols["seq"][i])]
        cols["group"][i] = index[c.group]
        if cols["kind"][i] == Kind.COMM:
            coll.event.append(i)
            coll.kind.append(CommKind.from_label(c.kind))
            coll.dtype.append(c.dtype)
    for src, dst in rows.flows:  # the gap where the thread blocked: named by what it waited for
        if cols["kind"][src] == Kind.COMM and cols["seq"][src] >= 0 and cols["kind"][dst] == Kind.COMM_WAIT:
            cols["name"][dst] = rows.intern(f"wait {rows.names[cols['name'][src]]}")
    return groups, {gname: [int(r) for r in gname.split(",")] for gname in groups}, coll


def check_units(info: FsdpInfo, rank: int, world: int, path: str) -> None:
    """Each unit's device mesh spans the job's data-parallel ranks (its size divides the world size: other ranks are
    another parallel dimension), and each collective runs on a group of this rank's of the size its mesh gives: the shard
    dimension's for all-gathers and reduce-scatters (a backward all-gather of a unit given ``reshard_after_forward=N``: N
    ranks, or the shard dimension's where it was not resharded), the replicate one's for HSDP's all-reduce. Otherwise the file is
    damaged, and ``--mesh`` would re-price a layout the job never had. Likewise a unit's frozen part is within it: more
    would leave it negative gradients and optimizer state."""
    for u in info.units:
        if u.mesh and (min(u.mesh) < 1 or world % math.prod(u.mesh)):
            raise DagprofError(f"unit {u.name}'s mesh {'x'.join(map(str, u.mesh))} does not fit the job's {world} ranks: a damaged file", path)
        if u.reshard_to and (not u.reshard_after_forward or u.reshard_to < 2 or not u.mesh or u.reshard_to >= u.mesh[-1]
                             or u.mesh[-1] % u.reshard_to):
            raise DagprofError(f"unit {u.name} reshards to {u.reshard_to} ranks after forward, which is no smaller group of its "
                               f"shard degree {u.mesh[-1] if u.mesh else '-'}: a damaged file", path)
        if u.frozen_numel > u.numel or u.frozen_tensors > len(u.params):
            raise DagprofError(f"unit {u.name} has {u.frozen_numel} frozen elements in {u.numel} and {u.frozen_tensors} frozen tensors in "
                               f"{len(u.params)}: a damaged file", path)
    for k, c in enumerate(info.collectives):
        if c.kind.upper() not in CommKind.__members__:
            raise DagprofError(f"collective {k} ({c.phase}) is of kind {c.kind!r}, which no collective is: a damaged file", path)
        ranks = [int(r) for r in c.group.split(",")]
        if c.phase in JOB_PHASES:  # the job's (a DTensor's gather over its mesh dimension, a call of its own): any group of this rank's
            if rank not in ranks or min(ranks) < 0 or max(ranks) >= world:
                raise DagprofError(f"collective {k} ({c.phase}) runs on ranks {c.group}, outside rank {rank}'s {world}-rank job: "
                                   "a damaged file", path)
            continue
        mesh = info.units[c.unit].mesh
        size = (mesh[0] if c.kind == "all_reduce" else mesh[-1]) if mesh else len(ranks)
        post = info.units[c.unit].reshard_to  # reshard_after_forward=N: the backward all-gather runs in the N-rank group
        sizes = {size, post} if post and c.kind == "all_gather" and c.phase == "backward" else {size}
        if rank not in ranks or len(ranks) not in sizes or min(ranks) < 0 or max(ranks) >= world:
            raise DagprofError(f"collective {k} ({c.kind}) runs on ranks {c.group}, but rank {rank}'s unit {info.units[c.unit].name} "
                               f"has mesh {'x'.join(map(str, mesh))} in a {world}-rank job: a damaged file", path)


def check_same_units(ranks: list[RankTrace], folder: str) -> None:
    """Every rank of an FSDP job wraps the same units (names, layers, parameters, dtypes, mesh): only its shard's bytes are its
    own. A rank whose units differ is another job's file or a damaged one (the graph takes rank 0's units for all)."""
    first = ranks[0]
    want = [msgspec.structs.replace(u, shard_bytes=0) for u in first.meta.fsdp.units]
    for t in ranks[1:]:
        got = [msgspec.structs.replace(u, shard_bytes=0) for u in t.meta.fsdp.units]
        if got != want:
            i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            what = (_unit_differs(i, got[i], want[i], first.rank) if i < min(len(got), len(want))
                    else f"it has {len(got)} FSDP units, rank {first.rank} {len(want)}")
            peers = {int(r) for c in first.meta.fsdp.collectives for r in c.group.split(",")}
            if peers and t.rank not in peers:  # a pipeline stage's own model (torch.distributed.pipelining beside FSDP)
                raise DagprofError(f"{what}, and the two never shard together (rank {first.rank}'s FSDP groups hold ranks "
                                   f"{','.join(map(str, sorted(peers)))}): FSDP beside pipeline stages, a model per stage, is not "
                                   "modelled (the graph takes one rank's units for all); a stock torch.profiler trace of the job is "
                                   "read, with FSDP's collectives labelled per mesh dimension", t.source)
            raise DagprofError(f"{what}: every rank of an FSDP job wraps the same units (another job's or a damaged file; "
                               f"compared with {os.path.relpath(first.source, folder)})", t.source)


def _unit_differs(i: int, got, want, rank: int) -> str:
    """How unit ``i`` differs from rank ``rank``'s: the units, or the first field apart where those read alike (its root)."""
    if _unit_text(got) != _unit_text(want):
        return f"its unit {i} is {_unit_text(got)}, rank {rank}'s {_unit_text(want)}"
    field = next(f for f in got.__struct_fields__ if getattr(got, f) != getattr(want, f))
    return f"its unit {i} ({got.name}) has {field} {getattr(got, field)!r}, rank {rank}'s {getattr(want, field)!r}"


def _unit_text(u) -> str:
    return f"{u.name} (mesh {'x'.join(map(str, u.mesh)) or '-'}, {len(u.params)} parameters, {u.numel:,} elements)"
