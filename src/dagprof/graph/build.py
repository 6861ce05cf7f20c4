"""Events -> one global dataflow graph over all ranks (dPRO's global DFG).

Rules, all derived from the normalised events (``traces.events`` conventions):
- every depth-0 event of a lane is a node; a lane's nodes form a chain (program order);
- a flow joins two instants its ``Dep`` rule names (a launch: the call's start; most others: the
  source's end); a depth-0 op with such an instant inside is cut there, so a kernel depends on the
  moment of its launch, not on the end of the op around the launch call (an instant less than the clock's
  resolution from the op's start or end is that start or end: no piece is shorter than a nanosecond);
- a host wait (a sync call, a blocking copy, a c10d wait on a host transfer) costs no time of its
  own: it ends when what it waits for ends, and whatever it measured beyond that becomes overhead (gap);
- a collective instance (matched across ranks by ``align.matching``) becomes one shared ``COMM``
  node on its process group's channel behind a ``SYNC`` join of every rank's ready point: it starts
  only once every participant entered it, so waiting for a slower rank emerges in the replay
  (``graph.shared_collectives`` says how it is timed from what each rank measured);
- each node's ``gap`` is its measured start minus the latest measured end of its predecessors
  (clipped at 0): the framework overhead the replayer adds back (dPRO);
- zero-cost ``STEP`` nodes mark every step boundary on each rank's main lane; each rank's first one
  starts at its measured offset from the earliest rank (clocks aligned beforehand), so the replay
  begins as skewed as the run did; the closing one also follows every lane's last op that ended before it.

A module a stage: ``graph.pieces`` (which events, flows as instants, pieces), ``graph.rank_nodes`` (one rank's
nodes and edges), ``graph.shared_collectives`` (one node per collective instance), ``graph.assemble`` (the graph
under construction, and its gaps).

``meta.provenance`` keeps each node's measured interval and each edge's rule (``graph.provenance``).
"""
from __future__ import annotations

import numpy as np

from ..align.clocks import SYMMETRIC
from ..align.matching import ROOT_SIZED, Matching
from ..align.one_clock import on_one_clock
from ..errors import DagprofError
from ..traces import cpu_sets
from ..traces.completeness import leave_out_empty_last, refuse_cut_steps
from ..traces.events import CommRole, Kind, RankTrace, Run
from ..traces.horovod import NEGOTIATE, REQUEST
from ..traces.meta import AtResponse, HookWire
from ..traces.parallelism import label_run
from ..traces.step_marks import mark_steps
from ..traces.steps import iteration_us, one_step, resynced_steps, say_resynced, stalled_steps, steady_window, step_range, time_between_steps
from ..traces.window_cpu import other_cores
from ..units import count
from .assemble import Assembler
from .dag import Graph
from .measured import GraphRule
from .meta import CoreGroup, LoopSteps
from .rank_nodes import add_rank
from .shared_collectives import add_collectives


def common_steps(run: Run, steps: range | None = None) -> list[int]:
    """Steps present on every rank (optionally restricted to ``steps``)."""
    per_rank = [set(r.step_spans()[:, 0].astype(int).tolist()) for r in run.ranks]
    if not per_rank or not all(per_rank):
        raise DagprofError("no profiled steps (ProfilerStep markers) found", run.source)
    common = set.intersection(*per_rank)
    if steps is not None:
        if not set(steps) & common:
            raise DagprofError(f"steps {steps.start}..{steps.stop - 1} requested but the trace holds steps {min(common)}..{max(common)}", run.source)
        common &= set(steps)
    if not common:
        raise DagprofError("the ranks share no profiled step", run.source)
    return sorted(common)


def chosen_steps(run: Run, steps: range | None = None) -> tuple[list[int], list[str]]:
    """``common_steps`` as one stretch of consecutive steps, and the lines that say what was left out of the window.

    A step inside the window that some ranks hold and others do not (its marker lost or skipped as corrupt on one
    rank) would chain the step before it to the one after on those ranks: a Kineto trace whose middle step marker read
    1e12 us replayed 24.5 ms for 16.3 (+50 %) with only the skipped event said. The longest stretch without such a step
    is kept (the first of equals). ``--steps`` asking for more steps than every rank holds keeps those held, and says so."""
    common = common_steps(run, steps)
    notes = []
    if steps is not None and len(common) < len(steps):
        notes.append(f"steps {steps.start}..{steps.stop - 1} requested ({count(len(steps), 'step')}), "
                     f"{count(len(common), 'is', 'are')} on every rank: the window is {step_range(common)}")
    held = {r.rank: set(r.step_spans()[:, 0].astype(int).tolist()) for r in run.ranks}
    holes = [s for s in range(common[0], common[-1] + 1) if s not in common and any(s in h for h in held.values())]
    if holes:
        stretches: list[list[int]] = [[]]
        for s in common:
            if stretches[-1] and s != stretches[-1][-1] + 1:
                stretches.append([])
            stretches[-1].append(s)
        kept = max(stretches, key=len)
        lack = "; ".join(f"rank {r} lacks step {', '.join(str(s) for s in holes if s not in h)}" for r, h in sorted(held.items())
                         if any(s not in h for s in holes))
        notes.append(f"{count(len(holes), 'step')} inside the window not on every rank ({lack}: its step marker missing or "
                     f"unreadable): steps {step_range(kept)} kept, {count(len(common) - len(kept), 'step')} left out")
        common = kept
    return common, notes


def host_cpus(run: Run) -> dict[str, CoreGroup]:
    """Per host whose ranks said their cores: (its ranks, the cores they may use together). Where every one of them said
    which cores (its affinity set), the union of the sets; else the fewest cores one of them could run on, which is the
    host's where the ranks are not pinned (``GraphMeta.host_cpus``)."""
    out = {}
    for h in {t.host for t in run.ranks if t.host and t.meta.cpus > 0}:
        mine = [t for t in run.ranks if t.host == h]
        sets = _affinity_sets(mine)
        out[h] = CoreGroup(len(mine), len(frozenset().union(*sets)) if sets else min(t.meta.cpus for t in mine))
    return out


def pinned_groups(run: Run) -> dict[str, tuple[CoreGroup, ...]]:
    """Per host whose ranks were pinned apart (every one said its affinity set, and not all of them overlap): each group
    of its ranks that may contend for cores, as (its ranks, the cores of their sets together). Ranks whose sets overlap,
    directly or through another's, are one group; a rank alone on its own cores is a group of its own
    (``GraphMeta.pinned_groups``). Largest groups first."""
    out = {}
    for h in {t.host for t in run.ranks if t.host and t.meta.cpus > 0}:
        groups: list[tuple[int, frozenset[int]]] = []  # (ranks, their cores)
        for s in _affinity_sets([t for t in run.ranks if t.host == h]):
            meet = [g for g in groups if g[1] & s]
            groups = [g for g in groups if not g[1] & s] + [(1 + sum(n for n, _ in meet), s.union(*(c for _, c in meet)))]
        if len(groups) > 1:
            out[h] = tuple(sorted((CoreGroup(n, len(c)) for n, c in groups), key=lambda k: (-k.ranks, k.cores)))
    return out


def _affinity_sets(ranks: list[RankTrace]) -> list[frozenset[int]]:
    """Each rank's affinity set where every one of ``ranks`` recorded it, else []."""
    return [cpu_sets.cores(t.meta.cpu_set) for t in ranks] if all(t.meta.cpu_set for t in ranks) else []


def host_tick_us(run: Run) -> dict[str, float]:
    """Per host whose ranks said their kernel's scheduler tick: the longest one said."""
    ticks = [(t.host, t.meta.scheduler_tick_us) for t in run.ranks if t.host and t.meta.scheduler_tick_us]
    return {h: max(us for k, us in ticks if k == h) for h in {h for h, _ in ticks}}


def measured_iter_us(trace: RankTrace, steps: list[int]) -> float:
    """Measured iteration time of ``trace`` over ``steps`` (``traces.steps.iteration_us``)."""
    spans = trace.step_spans()
    return iteration_us(spans[np.isin(spans[:, 0].astype(int), steps)])


def default_window(run: Run, steps: list[int]) -> tuple[list[int], list[str]]:
    """The steps of a window no ``--steps`` chose: ``steps`` less the iterations that hold a long time between two steps
    (``traces.steps.steady_window``) and those that folded two iterations into one (``traces.steps.resynced_steps``: the
    longest stretch without them is kept), and the lines that say so (none where nothing was left out)."""
    kept, note = steady_window({t.rank: t.step_spans() for t in run.ranks}, steps)
    said = [note] if note else []
    extra, usual = resynced_steps(_enqueues(run), kept)
    stretches: list[list[int]] = [[]]
    for s in kept:
        if s in extra or (stretches[-1] and s != stretches[-1][-1] + 1):
            stretches.append([])
        if s not in extra:
            stretches[-1].append(s)
    longest = max(stretches, key=len)
    if extra and longest:
        return longest, said + [say_resynced(extra, usual, left_out=True) + f": steps {step_range(longest)} kept"]
    return kept, said


def _enqueues(run: Run) -> dict[int, np.ndarray]:
    """Per rank of a DDP job, (step, bucket) of each DDP bucket's enqueue (``traces.steps.resynced_steps``)."""
    out = {}
    for t in (t for t in run.ranks if t.buckets):
        e = t.events
        m = (e.kind == Kind.COMM_ENQUEUE) & (e.bucket >= 0) & (e.step >= 0)
        out[t.rank] = np.column_stack((e.step[m], e.bucket[m])).astype(np.int64)
    return out


def stalls(run: Run, steps: list[int]) -> list[str]:
    """``traces.steps.stalled_steps`` and ``time_between_steps`` of the ranks over ``steps``."""
    spans = {t.rank: t.step_spans() for t in run.ranks}
    chosen = {r: a[np.isin(a[:, 0].astype(int), steps)] for r, a in spans.items()}
    extra, usual = resynced_steps(_enqueues(run), steps)
    resynced = say_resynced(extra, usual, left_out=False) if extra else None
    return [said for said in (stalled_steps(chosen), time_between_steps(chosen), resynced) if said]


def loop_steps(run: Run) -> LoopSteps | None:
    """The collector's step times of every rank (``traces.dagprof_run``); None for traces without them."""
    if not all(t.meta.unprofiled_step_times_us is not None for t in run.ranks):
        return None
    return LoopSteps({t.rank: {int(s): float(d) for s, d in t.meta.step_times_us.items()} for t in run.ranks},
                     {t.rank: {int(s): float(d) for s, d in (t.meta.unprofiled_step_times_us or {}).items()} for t in run.ranks},
                     {t.rank: {x.step: x for x in t.meta.train_thread + t.meta.unprofiled_train_thread} for t in run.ranks})


def hook_wire_of(run: Run) -> HookWire | None:
    """The job's ``HookWire``: rank 0's, varying where another rank's differs (``HookWire.merged``)."""
    first = run.ranks[0].meta.hook_wire
    if first is None:
        return None
    for t in run.ranks[1:]:
        first = first.merged(t.meta.hook_wire)
    return first


def build_graph(run: Run, steps: range | None = None, matching: Matching | None = None, step_marker: str | None = None) -> Graph:
    """The global DAG of ``run`` over the steps all ranks profiled (``steps`` of them; by default less the iterations
    that hold a long time between two steps, ``default_window``), its ranks' clocks aligned first (once).

    ``step_marker`` names the annotation that opens each iteration when the trace has no
    ``ProfilerStep``; without either, the whole profiled window is one iteration (``traces.step_marks``).
    """
    if not run.ranks:
        raise DagprofError("no rank traces to build a graph from", run.source)
    marked = step_marker is not None or all((t.events.kind == Kind.STEP).any() for t in run.ranks)  # else: one window, said
    run = mark_steps(run, step_marker)
    run, matching = on_one_clock(run, matching)  # may renumber a rank's steps (profilers started at other iterations)
    chosen, said = chosen_steps(run, steps)
    chosen, left_out = default_window(run, chosen) if steps is None else (chosen, [])
    if steps is None:
        chosen, empty = leave_out_empty_last(run, chosen)
        left_out += empty
    left_out = said + left_out + refuse_cut_steps(run, chosen)
    if marked and (note := one_step(chosen)):
        left_out.append(note)
    parallel, dims = label_run(run)
    asm = Assembler()
    p2p = tuple(k for k, it in enumerate(matching.instances) if it.p2p)
    # a default group whose ranks are not told lumps other groups' collectives, matched across all ranks in issue order: a
    # wait on such a shared node would hold a rank for ranks it never met (a 2-D FSDP x TP trace without pg_config replayed
    # +30 %, DDP x TP +27 %), so a host thread's waits for host transfers stay as measured there
    lumped = bool(parallel.ungrouped)
    for pos, trace in enumerate(run.ranks):
        inst = np.full(len(trace.events), -1, dtype=np.int64)
        inst[: len(matching.instance[pos])] = matching.instance[pos][: len(inst)]  # a window marker adds a row
        add_rank(asm, trace, chosen, inst, dims[pos], p2p, host_waits=not lumped)
    add_collectives(asm, frozenset(k for k, it in enumerate(matching.instances) if it.kind not in SYMMETRIC),
                    {k: it.ranks[1] for k, it in enumerate(matching.instances) if it.p2p}, _overlap_roots(run, matching),
                    {k: it.nbytes for k, it in enumerate(matching.instances) if it.kind in ROOT_SIZED})
    unjoined = _negotiation_joins(asm) if run.meta.horovod is not None else []
    g = asm.finish()
    g.meta = g.meta.replace(
        world_size=run.world_size,
        ranks=[t.rank for t in run.ranks],
        steps=chosen,
        backend=run.ranks[0].backend,
        framework=run.meta.framework or run.ranks[0].meta.framework or None,
        measured_iter_us={t.rank: measured_iter_us(t, chosen) for t in run.ranks},
        loop_steps=loop_steps(run),
        buckets=run.ranks[0].buckets,
        ddp_models=run.ranks[0].meta.ddp_models,
        ddp_api=run.ranks[0].meta.ddp_api,
        comm_hook=run.ranks[0].meta.comm_hook,
        hook_wire=hook_wire_of(run),
        find_unused=run.ranks[0].meta.find_unused,
        zero=run.ranks[0].meta.zero,
        source=run.source,
        warnings=run.meta.warning_texts() + left_out + stalls(run, chosen) + unjoined,
        parallel=parallel,
        horovod=run.meta.horovod,
        layer_grad_bytes=dict(run.ranks[0].meta.layer_grad_bytes),
        layer_frozen_bytes=dict(run.ranks[0].meta.layer_frozen_bytes),
        layer_saved_bytes=dict(run.ranks[0].meta.layer_saved_bytes),
        layer_output_bytes=dict(run.ranks[0].meta.layer_output_bytes),
        layer_autograd_nodes=dict(run.ranks[0].meta.layer_autograd_nodes),
        layer_types=dict(run.ranks[0].meta.layer_types),
        torch=run.ranks[0].meta.torch,
        grad_clips={s + run.ranks[0].meta.step_offset: c for s, c in run.ranks[0].meta.grad_clips.items()},
        host_cpus=host_cpus(run),
        pinned_groups=pinned_groups(run),
        host_tick_us=host_tick_us(run),
        host_other_cores=other_cores((t.host, t.meta.cpu_set, t.meta.window_cpu) for t in run.ranks),
        collective_operands_per_step=run.ranks[0].meta.collective_operands_per_step,
        padded_gathers=dict(run.meta.padded_gathers),
        host_segments={t.rank: t.meta.host_segments for t in run.ranks if t.meta.host_segments is not None},
        xla_compiles={t.rank: list(t.meta.xla_compiles) for t in run.ranks if t.meta.xla_compiles},
    )
    if run.meta.horovod is not None and run.meta.horovod.peer_waits:
        g = _peer_waits(g, run.meta.horovod.peer_waits)
    if run.meta.fsdp:
        from .build_fsdp import fsdp_meta  # noqa: PLC0415  (it imports this module's users)

        g.meta.fsdp = fsdp_meta(run)
    return g


def _negotiation_joins(asm: Assembler) -> list[str]:
    """Each Horovod negotiation (``CommRole.NEGOTIATION``: the coordinator's, rank 0's) behind a ``SYNC`` join of every
    rank's requests of its cycle. Horovod agrees a tensor once every rank asked for it, so the rank that asked last holds
    the negotiation, and which rank that is alternates with the load: kept in the negotiation's span (rank 0's own edges
    only), the wait was a fixed cost of rank 0 that an averaged step spread evenly (``hvd_pointnet_frozen``: -14 %), while a
    join's is kept as a mean of maxima (``passes.average_steps.join_waits``). The negotiation's own requests are its edges
    in; each other rank's are the same tensors' of the same step, its k-th request of a tensor there for rank 0's k-th
    (``traces.horovod`` pairs them so). Where a rank's is not in the graph the negotiation keeps its own edges only (the
    reader counted it: its span then holds the wait, as measured). A join is named by the tensor its cycle's first request
    asked for, so that the averaged model pairs it with other steps' joins of cycles that began there: the cycles a step
    has vary with the load (2 to 16 a step on ``hvd_transformer``), and paired by their order in the step a step's last was
    another's second (on 20 fresh runs of two scripts 15 of 20 averaged replays within 3 % that way, 17 so). Returns the
    warning that counts the negotiations left without a join (none: [])."""
    b = asm.b
    role, kind = np.array(b._cols["role"]), np.array(b._cols["kind"])  # copies: the builder grows below
    negotiations = np.flatnonzero((role == CommRole.NEGOTIATION) & (kind == Kind.OTHER))
    if not len(negotiations):
        return []
    rank, step, names = (np.array(b._cols[c]) for c in ("rank", "step", "name"))
    mstart, mend = np.array(asm.mstart), np.array(asm.mend)
    asked: dict[tuple[int, int, str], list[int]] = {}  # (rank, step, tensor) -> its request nodes in start order
    tensor_of: dict[int, tuple[str, int]] = {}  # request node -> (tensor, its place among its rank's requests of it in the step)
    for v in sorted(np.flatnonzero(kind == Kind.COMM_ENQUEUE).tolist(), key=lambda v: mstart[v]):
        head = f"rank{rank[v]}.{REQUEST}"
        if b.names[names[v]].startswith(head):
            t = b.names[names[v]][len(head):]
            nodes = asked.setdefault((int(rank[v]), int(step[v]), t), [])
            tensor_of[v] = (t, len(nodes))
            nodes.append(v)
    src, dst = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (asm.src, asm.dst))
    into = np.isin(dst, negotiations)
    preds: dict[int, set[int]] = {}  # negotiation -> its sources so far
    for u, v in zip(src[into].tolist(), dst[into].tolist()):
        preds.setdefault(v, set()).add(u)
    on = sorted(asm.base_ns)
    alone = 0
    links: list[tuple[int, int, float]] = []  # (u, v, u's end on v's clock: NaN, its own)
    for v in sorted(negotiations.tolist(), key=lambda v: mstart[v]):
        own = [tensor_of[u] for u in sorted(preds.get(v, ()), key=lambda u: mstart[u]) if u in tensor_of]
        every = [asked.get((r, int(step[v]), t), [])[k:k + 1] for r in on for t, k in own]
        if not own or not all(every):
            alone += 1
            continue
        sync = asm.node(f"sync.{NEGOTIATE} {own[0][0]}.{v}", Kind.SYNC, np.nan, np.nan, dur=0.0, order=0.0, step=int(step[v]), role=CommRole.NEGOTIATION)
        asm.fixed_gap[sync] = 0.0
        us = [u for nodes in every for u in nodes]
        links += [(u, sync, np.nan) for u in us]
        links.append((sync, v, max(mend[u] + (asm.base_ns[int(rank[u])] - asm.base_ns[int(rank[v])]) / 1e3 for u in us)))
    if links:
        u, v, seen = (np.array(x) for x in zip(*links))
        asm.edges(u, v, GraphRule.NEGOTIATION, seen)
    return ([f"{alone} of {len(negotiations)} Horovod negotiations in the graph wait for rank 0's own requests only (another "
             "rank's requests of their tensors not found in the same step): their spans keep the wait as measured"] if alone else [])


def _peer_waits(g: Graph, waits: list[AtResponse]) -> Graph:
    """Rank 0's Horovod negotiations carrying, as their ``exit_lag``, the part of their span a peer spent still in the
    previous response (``HorovodRecord.peer_waits``): wire time that ``passes.comm`` scales with the link."""
    us = {(w.step, w.position): w.us for w in waits}
    lag = g.exit_lag.copy()
    for v in np.flatnonzero((g.kind == Kind.OTHER) & (g.rank == 0)).tolist():
        if (w := us.get((int(g.step[v]), int(g.bucket[v])))) and g.role[v] == CommRole.NEGOTIATION:
            lag[v] = min(w, float(g.dur[v]))
    return g.replace(exit_lag=lag)


def _overlap_roots(run: Run, matching: Matching) -> dict[int, int]:
    """Collective instance -> its root rank, for the ZeRO broadcasts of an overlapped step (``overlap_comm``: their
    completions are the hooks', the root's as soon as its sends were handed over). The non-overlapped step's (Kineto's
    spans) is left as it was measured and checked: its figures were not re-measured with this rule."""
    zero = run.ranks[0].meta.zero if run.ranks else None
    if zero is None or not zero.buckets:
        return {}
    return {k: it.root for k, it in enumerate(matching.instances) if it.root >= 0}
