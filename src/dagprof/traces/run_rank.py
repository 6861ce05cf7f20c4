"""One rank file of a dagprof run folder -> its ``RankTrace``: the file checked, its communication chosen, its event table.

The main lane of every profiled step is partitioned by ``run_partition``; the collectives' transfers come from
``run_comm`` (Kineto, else the comm hooks) or, for an FSDP2 job (``RankFile.fsdp``), from ``fsdp_run``.
Flows: enqueue -> transfer; transfer -> the step's last COMM_WAIT (or UPDATE), or for a
blocking host collective -> the main-lane event after it. On GPUs the hook spans are host
(launch) time; Kineto's kernels and copies go on their stream lanes, each taking the step,
layer and kind of the main-lane span that launched it (flow launch -> op, op -> the span of
the host sync that waited for it). Not yet run on a real GPU job.
"""
from __future__ import annotations

import contextlib
import os

import numpy as np

from ..errors import DagprofError
from ..fsutil import inside, open_input
from .events import CommKind, CommRole, Dep, EventRows, Kind, Lane, LaneKind, RankTrace
from .fsdp_run import check_units, fsdp_comm, label_groups
from .meta import GradClip, RankMeta, split_at_window, step_scheds, warnings_of
from .run_comm import hook_comm, hook_wire, kineto_comm
from .run_partition import partition_step, step_bounds
from .run_schema import JOB_PHASES, RANK_FORMAT, Col, RankFile, Rec, checked_cpu_set, ddp_label, read_file
from .run_spans import _Comm, _DeviceOp, _Span
from .zero_run import check_zero, label_zero, overlap_comm, overlap_targets


def read_rank(path: str, f: RankFile | None = None, kineto: bool = True) -> RankTrace:
    """One rank from its file at ``path`` (or ``f``, already decoded or rebuilt); ``kineto=False`` ignores its Kineto trace."""
    with corrupt_content(path):
        return _read_rank(path, read_file(path, RankFile) if f is None else f, kineto)


@contextlib.contextmanager
def corrupt_content(path: str):
    """A value of an unexpected type or range in a run file is one line naming that file (never a traceback)."""
    try:
        yield
    except (LookupError, TypeError, ValueError, ArithmeticError, AttributeError) as err:
        raise DagprofError(f"corrupt or foreign content ({type(err).__name__}: {' '.join(str(err).split())[:200]})", path) from None


def _read_rank(path: str, f: RankFile, kineto: bool) -> RankTrace:
    records = np.asarray(f.records, dtype=np.int64).reshape(-1, len(Col))
    twice = len(records) - len(np.unique(records, axis=0))
    if twice:  # a hook times each record in ns: a row twice is a file written twice (read before as mismatched collectives)
        raise DagprofError(f"{twice} hook records appear twice (same kind, ids and ns time): a file written twice, or two "
                           "files merged", path)
    first, stop = f.steps_requested
    profiled, layers = f.steps_profiled, f.layers
    grad_bytes = [f.layer_grad_bytes.get(name, 0) for name in layers]
    run = os.path.dirname(path) or "."
    done = f.steps_completed
    ended = f"training ended after {done} steps (last step {done - 1})" if done else "training never completed a step"
    warnings = list(f.warnings)
    if not profiled and warnings:
        raise DagprofError(f"no step was profiled ({warnings[0]})", path)
    if not profiled:
        raise DagprofError(f"run {run}: steps {first}-{stop - 1} requested but {ended}", path)
    _check_step_times(f, path)
    if f.fsdp is not None and f.ddp:  # replicate(model) over fully_shard-ed blocks: torch allows it, on a 2-D mesh too
        raise DagprofError(f"DDP's gradient buckets ({ddp_label(f.ddp_api)}) beside fully_shard units in one job are not modelled: FSDP's "
                           "units are read alone, and DDP's all-reduces would be host time no what-if prices; profile it as HSDP "
                           "instead (fully_shard on a 2-D DeviceMesh, replicate x shard: modelled, its what-ifs answer), or the "
                           f"model under {ddp_label(f.ddp_api)} alone, whose whatif --data-parallel fsdp prices sharding it", path)
    if len(profiled) < stop - first:
        warnings.append(f"run {run}: steps {first}-{stop - 1} requested but {ended}: steps {profiled[0]}-{profiled[-1]} profiled")
    kpath = None
    if f.kineto_file:  # checked even when the hooks give the communication: a rank file names nothing outside its run
        kpath = inside(run, f.kineto_file, path)
        if not os.path.exists(kpath):
            raise DagprofError("the rank file names this Kineto trace but it is missing", kpath)
        open_input(kpath).close()  # a regular file (a FIFO is refused before any read)
        kpath = kpath if kineto else None
    steps = step_bounds(records)
    if f.fsdp is not None:
        _check_fsdp_indices(f.fsdp, records, path)
        check_units(f.fsdp, f.rank, f.world_size, path)
        comm = fsdp_comm(f.fsdp, kpath, f.rank, f.world_size, records, steps, warnings)
    else:
        if f.zero is not None:
            check_zero(f.zero, f.world_size, path)
        if f.zero is not None and f.zero.buckets:  # overlap_with_ddp: ZeRO stepped inside DDP's comm hook
            comm = overlap_comm(records, f.zero, steps, kpath is not None, warnings, path)
        else:
            dp = tuple(f.ddp_group_ranks)  # a comm hook's all-gathers gather DDP's group's ranks
            comm = kineto_comm(kpath, f.rank, f.world_size, records, steps, warnings, dp) if kpath else hook_comm(records, len(dp) or f.world_size)
            if f.zero is not None:
                label_zero(comm, f.zero, records, f.rank, kpath is not None, warnings)
    t = records[:, Col.T_NS]
    if steps:  # a hook's time beyond the window by more than a step is damage; it would be left out of every step unseen
        longest = max(b1 - b0 for _, b0, b1 in steps)
        stray = int(np.count_nonzero((t < steps[0][1] - longest) | (t > steps[-1][2] + longest)))
        if stray:
            warnings.append(f"{os.path.basename(path)}: {stray} of {len(t)} hook records are timed more than a step outside the "
                            "profiled steps (damaged file?): left out")
    _unhooked_layers(records, steps, os.path.basename(path), warnings)
    _no_grad_forwards(records, steps, os.path.basename(path), warnings)
    spans = [(step, b0, b1, partition_step(records[(t >= b0) & (t <= b1)], b0, b1, layers, comm, grad_bytes)) for step, b0, b1 in steps]
    trace = _to_rank_trace(f, path, spans, comm, layers)
    trace.meta.warnings, trace.meta.comm_source, trace.meta.kineto = warnings_of(warnings), comm.source, kpath
    trace.meta.unseen_collectives, trace.meta.in_op_groups = comm.unseen, comm.in_op_groups
    trace.meta.hook_wire = hook_wire(records, len(f.ddp_group_ranks) or f.world_size)
    trace.meta.grad_clips = _grad_clips(records, steps)
    trace.meta.fsdp, trace.meta.optimizer_ops, trace.meta.zero = f.fsdp, comm.optimizer, f.zero
    return trace


def _grad_clips(records: np.ndarray, steps: list[tuple[int, int, int]]) -> dict[int, GradClip]:
    """Each profiled step's ``clip_grad_norm_`` calls (``Rec.GRAD_CLIP``)."""
    clip = records[records[:, Col.CODE] == Rec.GRAD_CLIP]
    out = {}
    for step, b0, b1 in steps:
        sel = clip[(clip[:, Col.T_NS] >= b0) & (clip[:, Col.T_NS] <= b1)]
        if len(sel):
            out[int(step)] = GradClip(len(sel), int(sel[:, Col.A].sum()), float(sel[:, Col.X].sum()) / 1e3)
    return out


def _check_step_times(f: RankFile, path: str) -> None:
    """The loop's step times (``step_times_ns``) judge the profiler's own cost (``passes.profiler_cost``): the collector
    times every step it profiles, each ending after it begins; anything else is damage, never a cost of 0 or below."""
    backwards = [s for s, t0, t1 in f.step_times_ns if t1 < t0 or t0 <= 0]
    if backwards:
        raise DagprofError(f"{len(backwards)} step time(s) in step_times_ns end before they begin or start at no time "
                           f"(step {backwards[0]}): a damaged file", path)
    untimed = sorted(set(f.steps_profiled) - {s for s, _, _ in f.step_times_ns})
    if untimed:
        raise DagprofError(f"{len(untimed)} profiled step(s) have no time in step_times_ns (step {untimed[0]}): a damaged file", path)


def _check_fsdp_indices(info, records: np.ndarray, path: str) -> None:
    """FSDP records name a collective or a unit of the file's lists: one beyond them lost its collective unseen (then
    "mismatched collectives" naming neither file nor record)."""
    code, a = records[:, Col.CODE], records[:, Col.A]
    for codes, listed, what in (((Rec.FSDP_COLL_BEGIN, Rec.FSDP_COLL_END), len(info.collectives), "collective"),
                                ((Rec.FSDP_COPY_OUT_BEGIN, Rec.FSDP_COPY_OUT_END, Rec.FSDP_RESHARD_BEGIN, Rec.FSDP_RESHARD_END),
                                 len(info.units), "unit")):
        named = a[np.isin(code, codes)]
        bad = named[(named < 0) | (named >= listed)]
        if len(bad):
            raise DagprofError(f"{len(bad)} FSDP record(s) name {what} {int(bad[0])}, but the file lists {listed} {what}s: a damaged file", path)
    n = len(info.units)  # each collective's unit, and the unit that prefetched it (-1: none), are in the list too
    named = [u for c in info.collectives for u, lo in ((c.unit, -(c.phase in JOB_PHASES)), (c.prefetched_by, -1)) if not lo <= u < n]
    if named:
        raise DagprofError(f"{len(named)} FSDP collective(s) name unit {named[0]}, but the file lists {len(info.units)} units: a damaged file", path)


def _unhooked_layers(records: np.ndarray, steps: list[tuple[int, int, int]], name: str, warnings: list[str]) -> None:
    """Say when gradients were accumulated in the window but no layer's forward or backward hook ran: modules that run
    inside ``torch.compile``'s graphs do not call their hooks, so the steps' compute is gaps named ``other:*`` only."""
    if not steps:
        return
    code, t = records[:, Col.CODE], records[:, Col.T_NS]
    inside = (t >= steps[0][1]) & (t <= steps[-1][2])
    grads = int(np.count_nonzero(inside & (code == Rec.GRAD_READY)))
    if grads and not np.any(inside & np.isin(code, [Rec.FWD_BEGIN, Rec.BWD_BEGIN])):
        warnings.append(f"{name}: {grads} gradients were accumulated in its {len(steps)} profiled steps but no layer's forward or "
                        "backward hook ran (a model under torch.compile: its graphs run the modules without their hooks): forward "
                        "and backward are gaps named other:*, so re-bucketing, --no-overlap, --data-parallel and optimize "
                        "cannot be predicted, and link and worker what-ifs keep each all-reduce where it was issued")


def _no_grad_forwards(records: np.ndarray, steps: list[tuple[int, int, int]], name: str, warnings: list[str]) -> None:
    """Say which profiled steps ran layer forwards under ``torch.no_grad`` (``Rec.FWD_BEGIN``'s x): an evaluation pass
    in the loop. Its forwards are timed as any forward, so they sit in their step's time and the window's mean
    iteration, which no training step takes; and ``--workers`` keeps them per rank as profiled, where a
    ``DistributedSampler`` over an evaluation set gives each of more workers fewer batches. ``habits_loop.py``'s
    profiled evaluation step ran 2.7 s, its training steps 0.3-0.8 s: the window's mean was 872 ms, without a word.
    Where every profiled step ran them they are the step's own (DINO's teacher, ``bench/fsdp_fresh/dino_ema_teacher.py``),
    and no ``--steps`` window leaves them out.

    Reentrant activation checkpointing (``checkpoint(..., use_reentrant=True)``) runs its blocks' forward under no_grad
    too, and again with autograd on inside the backward: per step and layer, as many of its no_grad forwards before the
    backward are not counted as it ran forwards with autograd on in the backward beyond those it ran before it (a
    non-reentrant checkpoint's recomputation repeats a forward that had autograd on). ``bench/ddp_fresh/ckpt_static_tied.py``
    had every step called an evaluation pass; ``bench/fsdp_fresh/gnn_ckpt_eval.py``'s evaluation passes, between one
    step's update and the next step's forward, stay counted."""
    code, t, x = records[:, Col.CODE], records[:, Col.T_NS], records[:, Col.X]
    quiet = (code == Rec.FWD_BEGIN) & (x == 1)
    if not quiet.any():
        return
    bwd = np.isin(code, [Rec.BWD_BEGIN, Rec.BWD_END])
    fwd, layer = code == Rec.FWD_BEGIN, records[:, Col.A]
    for _, b0, b1 in steps:
        inside = (t >= b0) & (t <= b1)
        if not (bwd & inside).any():
            continue
        before = inside & (t < t[bwd & inside].min())
        after = inside & ~before
        for lay in np.unique(layer[quiet & before]).tolist():
            mine = fwd & (layer == lay)
            rerun = int(np.count_nonzero(mine & after & (x == 0))) - int(np.count_nonzero(mine & before & (x == 0)))
            if rerun > 0:
                quiet[np.flatnonzero(mine & before & (x == 1))[:rerun]] = False
    hit = [(s, int(np.count_nonzero(quiet & (t >= b0) & (t <= b1))), b0, b1) for s, b0, b1 in steps]
    hit = [(s, n, b0, b1) for s, n, b0, b1 in hit if n]
    if not hit:
        return
    span_ms = sum(float(np.ptp(t[quiet & (t >= b0) & (t <= b1)])) for _, _, b0, b1 in hit) / 1e6
    step_ms = sum(b1 - b0 for _, _, b0, b1 in hit) / 1e6
    every = len(hit) == len(steps)  # a teacher's or target network's forward each step: no window leaves it out
    guess, keep = (("a frozen teacher's or a target network's forward each step?", "; every step ran them: part of the step "
                    "the loop repeats") if every else ("an evaluation pass?", " (a DistributedSampler gives each of more workers "
                                                       "fewer evaluation batches); a window without them (--steps) times training alone"))
    warnings.append(f"{name}: {len(hit)} of {len(steps)} profiled steps (step {', '.join(str(s) for s, *_ in hit)}) ran "
                    f"{sum(n for _, n, *_ in hit)} layer forwards under torch.no_grad ({guess}), over "
                    f"{span_ms:.0f} of those steps' {step_ms:.0f} ms: they count in the window's mean iteration and as "
                    f"forward compute in every command, and --workers keeps them per rank as profiled{keep}")


def _to_rank_trace(f: RankFile, path: str, steps: list, comm: _Comm, layers: list[str]) -> RankTrace:
    base_ns = min(b for _, b, _, _ in steps)
    rows = EventRows()

    def add(name: str, kind: Kind, lane: int, t0: int, t1: int, step: int, layer: int = -1, nbytes: int = 0,
            seq: int = -1, bucket: int = -1, depth: int = 0, root: int = -1, role: CommRole = CommRole.PLAIN,
            comm_kind: CommKind = CommKind.UNKNOWN, group_size: int = 0) -> int:
        """A span in ns of the rank's clock; a collective (``seq``) is of the run's one group, ``root`` its ``peer``."""
        return rows.add(name, kind, lane, (t0 - base_ns) / 1e3, (t1 - t0) / 1e3, depth=depth, step=step, layer=layer,
                        nbytes=nbytes, group=0 if seq >= 0 else -1, seq=seq, bucket=bucket, peer=root, role=int(role),
                        comm_kind=int(comm_kind), group_size=group_size)

    lanes = [Lane(f"thread {f.pid} (main)", LaneKind.CPU_THREAD, main=True)]
    comm_lanes = sorted({(t.lane, t.lane_kind) for t in comm.transfers})
    lane_of = {name: 1 + k for k, (name, _) in enumerate(comm_lanes)}
    lanes += [Lane(name, kind) for name, kind in comm_lanes]
    enqueue_ev: dict[int, int] = {}  # seq -> host event
    after_ev: dict[int, int] = {}  # seq -> the main-lane event that needs the transfer
    step_of: dict[int, int] = {}
    transfer_end = {t.seq: t.end for t in comm.transfers}
    for step, b0, b1, spans in steps:
        add(f"ProfilerStep#{step}", Kind.STEP, 0, b0, b1, step, depth=-1)
        # A host collective (DDP's buffer broadcast) is issued asynchronously and waited for later: the
        # main thread is blocked in the gap during which its transfer ends. That gap is the wait.
        zero_waits = overlap_targets(spans)  # ZeRO's overlapped step: the waits it recorded (empty in other jobs)
        blocked = {k: _blocked_in(spans, k, transfer_end.get(s.seq)) for k, s in enumerate(spans)
                   if s.kind == Kind.COMM_ENQUEUE and s.bucket < 0 and k not in zero_waits}
        waits = {w for w in blocked.values() if w is not None and spans[w].kind == Kind.OTHER}
        ids = [add(f"{s.name} (blocked on a collective)" if k in waits else s.name, Kind.COMM_WAIT if k in waits else s.kind, 0,
                   s.start, s.end, step, s.layer, s.nbytes, s.seq, s.bucket, root=s.root, role=s.role, comm_kind=s.comm_kind,
                   group_size=s.group_size)
               for k, s in enumerate(spans)]
        # the last backward's wait (earlier ones are gradient-accumulation passes without communication)
        sink = next((i for i, s in zip(ids[::-1], spans[::-1]) if s.kind == Kind.COMM_WAIT), None)
        sink = sink if sink is not None else next((i for i, s in zip(ids, spans) if s.kind == Kind.UPDATE), None)
        for k, (i, s) in enumerate(zip(ids, spans)):
            if s.kind != Kind.COMM_ENQUEUE:
                continue
            enqueue_ev[s.seq], step_of[s.seq] = i, step
            # a bucket all-reduce is needed by the step's wait; a host collective where the thread blocked on it
            if k in zero_waits:
                target = ids[zero_waits[k]]
            else:
                target = sink if s.bucket >= 0 else (ids[blocked[k]] if blocked[k] is not None else None)
            if target is not None:
                after_ev[s.seq] = target
    device_rules = _add_device_ops(comm.device, rows, add, lanes, base_ns)
    for t in comm.transfers:
        if t.seq not in enqueue_ev:
            continue
        i = add(t.name, Kind.COMM, lane_of[t.lane], t.start, t.end, step_of[t.seq], nbytes=t.nbytes, seq=t.seq, bucket=t.bucket,
                root=t.root, role=t.role, comm_kind=t.comm_kind)
        rows.flows.append((enqueue_ev[t.seq], i))
        if t.seq in after_ev:
            rows.flows.append((i, after_ev[t.seq]))
    ddp_ranks = list(f.ddp_group_ranks or comm.dp_ranks) or list(range(f.world_size))
    group = "0" if len(ddp_ranks) == f.world_size else "ddp " + ",".join(map(str, ddp_ranks))  # a mesh's DP group: matched within it
    groups, group_ranks, collectives = ([group], {group: ddp_ranks}, None) if f.fsdp is None else label_groups(rows, f.fsdp)
    profiled = set(f.steps_profiled)
    step_times = {s: (t1 - t0) / 1e3 for s, t0, t1 in f.step_times_ns}
    train_thread, unprofiled_train_thread = split_at_window(step_scheds(f.thread_sched_ns, f.process_cpu_ns, f.thread_runs, f.other_threads_ns), profiled)
    meta = RankMeta(
        format=RANK_FORMAT,
        pid=f.pid,
        cpus=f.cpus,
        cpu_set=checked_cpu_set(f.cpu_set, f.cpus, path),
        torch=f.torch,
        mode=f.mode,
        bucket_cap_mb=f.bucket_cap_mb,
        ddp_models=f.ddp_models,
        ddp_api=f.ddp_api,
        comm_hook=f.comm_hook,
        find_unused=f.find_unused,
        steps_requested=list(f.steps_requested),
        steps_profiled=f.steps_profiled,
        steps_completed=f.steps_completed,
        step_times_us={s: d for s, d in step_times.items() if s in profiled},
        unprofiled_step_times_us={s: d for s, d in step_times.items() if s not in profiled},
        train_thread=train_thread,
        unprofiled_train_thread=unprofiled_train_thread,
        comm_lanes=[name for name, _ in comm_lanes],
        layer_grad_bytes=f.layer_grad_bytes,
        layer_frozen_bytes=f.layer_frozen_bytes,
        layer_saved_bytes=f.layer_saved_bytes,  # activations each layer keeps for backward
        layer_output_bytes=f.layer_output_bytes,
        layer_autograd_nodes=f.layer_autograd_nodes,
        layer_types=f.layer_types,
        collectives=collectives,
    )
    return RankTrace(
        rank=f.rank, world_size=f.world_size, source=path, events=rows.table(), lanes=lanes,
        base_ns=base_ns, host=f.host, backend=f.backend, layers=layers, groups=groups, group_ranks=group_ranks,
        flows=rows.flow_array(), flow_rule=_flow_rules(len(rows.flows), device_rules), buckets=f.bucket_layouts[-1] if f.bucket_layouts else (), meta=meta,
    )


def _flow_rules(n: int, given: dict[int, Dep]) -> np.ndarray:
    """Every flow's rule: ``Dep.AFTER`` (the hooks' spans in order) but those given; empty (all AFTER) when none is."""
    if not given:
        return np.empty(0, dtype=np.int8)
    rules = np.full(n, int(Dep.AFTER), dtype=np.int8)
    rules[list(given)] = [int(r) for r in given.values()]
    return rules


def _blocked_in(spans: list[_Span], k: int, end_ns: int | None) -> int | None:
    """The main-lane span after ``k`` that waited for a transfer ending at ``end_ns``: the gap in which
    it ended (the thread was blocked there), else the first span that starts after it (no delay)."""
    if end_ns is None:
        return k + 1 if k + 1 < len(spans) else None
    during = next((j for j in range(k + 1, len(spans)) if spans[j].end >= end_ns), None)
    if during is not None and spans[during].kind == Kind.OTHER:
        return during
    return next((j for j in range(k + 1, len(spans)) if spans[j].start >= end_ns), None)


def _add_device_ops(device: list[_DeviceOp], rows: EventRows, add, lanes: list[Lane], base_ns: int) -> dict[int, Dep]:
    """GPU ops on their stream lanes; the main-lane event around the launch gives the step, layer and kind. The runtime
    call that launched an op and the host call that waited for it become calls inside the main-lane spans around them,
    joined by Kineto's rules (a kernel after its launch call's start; a sync a wait released when the kernel ends), so
    the graph cuts a coarse hook span where its kernels were launched. Returns those flows' rules (by flow index)."""
    rules: dict[int, Dep] = {}
    if not device:
        return rules
    cols = rows.columns()  # the host rows, which the device ops added after them leave as they are
    main = np.flatnonzero((cols["lane"] == 0) & (cols["depth"] == 0))
    main = main[np.argsort(cols["start"][main], kind="stable")]
    starts = cols["start"][main]

    def around(t_ns: int) -> int | None:
        if t_ns < 0 or not len(main):
            return None
        k = int(np.searchsorted(starts, (t_ns - base_ns) / 1e3, side="right")) - 1
        if k < 0:
            return None
        i = int(main[k])
        return i if (t_ns - base_ns) / 1e3 <= cols["start"][i] + cols["dur"][i] else None

    lane_of = {lane.name: k for k, lane in enumerate(lanes) if k}  # a stream may already carry collectives
    syncs: dict[tuple[int, int], int] = {}  # one host call waits for many ops
    for op in device:
        if op.lane not in lane_of:
            lane_of[op.lane] = len(lanes)
            lanes.append(Lane(op.lane, LaneKind.GPU_STREAM))
        host = around(op.launch)
        kind, step, layer = op.kind, -1, -1
        if host is not None:
            step, layer = int(cols["step"][host]), int(cols["layer"][host])
            if cols["kind"][host] in (Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE):
                kind = Kind(int(cols["kind"][host]))
        i = add(op.name, kind, lane_of[op.lane], op.start, op.end, step, layer)
        if host is not None:
            call = add("cuda launch", Kind.RUNTIME, 0, op.launch, max(op.launch, op.launch_end), step, layer, depth=1)
            rules[len(rows.flows)] = Dep.LAUNCH
            rows.flows.append((call, i))
        waiter = around(op.sync)
        if waiter is not None:
            key = (op.sync_start, op.sync)
            if key not in syncs:
                syncs[key] = add("cuda sync", Kind.COMM_WAIT, 0, op.sync_start, op.sync, int(cols["step"][waiter]),
                                 int(cols["layer"][waiter]), depth=1)
            rules[len(rows.flows)] = op.sync_rule
            rows.flows.append((i, syncs[key]))
    return rules
