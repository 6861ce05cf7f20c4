"""The global graph of an FSDP job (FSDP2 or FSDP1; ``traces.fsdp_run``), with what FSDP guarantees as its edges.

The events already say where each rank's main thread called every collective and where it
blocked on it, so the graph is ``graph.build``'s (each collective one shared node behind a join of
its group's ranks; ``build_graph`` adds ``fsdp_meta`` for an FSDP run) and these orderings are its edges:

- a unit's forward waits for its all-gather: transfer -> the wait ("blocked on a collective") ->
  program order -> the unit's first layer;
- prefetch issues the next unit's all-gather from the current unit's hook, before that unit's
  compute (program order; FSDP1's ``BACKWARD_POST``: after its backward, before its reduce-scatter),
  and the channel of a group holds one collective at a time: gloo on CPU runs FSDP's collectives
  synchronously, so at most one all-gather is in flight (``max_in_flight``);
- ``reshard_after_forward`` frees the gathered parameters, so a resharded unit has a second
  all-gather in its backward; a unit that keeps them has none;
- a unit's reduce-scatter is issued by its post-backward hook after its layers' backward;
- the optimizer step starts after every reduce-scatter's wait (program order after blocking calls).

``meta.fsdp`` keeps the units and, per collective kind, what the what-ifs need (``passes.fsdp``).
``fsdp_collectives`` lists the shared collective nodes with their kind, unit and pass (from the
names ``traces.fsdp_run`` gives them); ``check_fsdp_edges`` checks every ordering above on a graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..costmodel.fsdp_costs import StepFit
from ..costmodel.topology import ROOTED, allreduce_equivalent_factor
from ..errors import DagprofError
from ..traces.events import CommKind, CommRole, Kind, LaneKind, Run
from ..traces.fsdp_run import untimed_roots
from ..traces.kineto_schema import dtype_bytes
from .dag import Graph
from .meta import FsdpGraphUnit, FsdpRecord, FsdpShards

FSDP_KINDS = (CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER, CommKind.ALL_REDUCE)  # the collectives FSDP issues


def is_fsdp_graph(g: Graph) -> bool:
    return g.meta.fsdp is not None


def fsdp_meta(run: Run) -> FsdpRecord:
    """``meta.fsdp`` of an FSDP run's graph (``graph.build.build_graph`` sets it, so every path to a graph has it)."""
    if not run.meta.fsdp:
        raise DagprofError("not an FSDP run (no FSDP units recorded)", run.source)
    t0 = run.ranks[0]
    names = set(t0.events.names)  # what a unit did is what counts (FSDP1's root never reshards after forward)
    units = [FsdpGraphUnit(u.name, u.numel, u.shard_bytes, u.orig_dtype, u.param_dtype, u.reduce_dtype, u.reshard_after_forward,
                           f"fsdp reshard {u.name} (forward)" in names, list(u.mesh), list(u.mesh_dims), [t0.layers[i] for i in u.layers],
                           len(u.params), u.frozen_numel, u.frozen_tensors, u.reshard_to, u.offload, root, u.root)
             for u, root in zip(t0.meta.fsdp.units, untimed_roots(t0.meta.fsdp.units), strict=True)]
    return FsdpRecord(
        units=units,
        memory={t.rank: FsdpShards(t.meta.fsdp.param_shard_bytes, t.meta.fsdp.grad_shard_bytes, t.meta.fsdp.optim_state_bytes)
                for t in run.ranks},
        backend=t0.backend,
        world_size=run.world_size,
        layer_saved_bytes=dict(t0.meta.layer_saved_bytes),  # rank 0's: activations for the memory model
        layer_grad_bytes=dict(t0.meta.layer_grad_bytes),
        api=t0.meta.fsdp.api,
        layer_saved_gathered_bytes=None if (gathered := t0.meta.fsdp.layer_saved_gathered_bytes) is None else dict(gathered),
        layer_output_bytes=None if (outs := t0.meta.fsdp.layer_output_bytes) is None else dict(outs),
        layer_input_bytes=None if (ins := t0.meta.fsdp.layer_input_bytes) is None else dict(ins),
        unit_saved_outside_bytes=None if (between := t0.meta.fsdp.unit_saved_outside_bytes) is None else dict(between),
        step_fit=profiled_step(run, units),
    )


def step_size(units: list[FsdpGraphUnit]) -> tuple[int, int]:
    """What a rank's optimizer step works on: the parameter tensors that take a gradient (each rank steps a shard of every
    one; frozen ones have no gradient to step) and their unsharded bytes (a rank's shards: these over the shard degree)."""
    return sum(u.grad_tensors for u in units), sum(u.grad_numel * dtype_bytes(u.orig_dtype) for u in units)


def profiled_step(run: Run, units: list[FsdpGraphUnit]) -> StepFit | None:
    """The optimizer step as the profile's Kineto ops split it (``traces.fsdp_run.optimizer_ops``), over every rank's
    steps: the ops on the local shards per byte of the rank's shards, the rest per tensor. None where a rank's trace has
    no Kineto or its steps no DTensor dispatch (nothing tells the two parts apart), and on a GPU, where the step's work
    on the bytes is its kernels and its host ops launch them (not modelled: the bytes rule, as before)."""
    ops = [t.meta.optimizer_ops for t in run.ranks]
    tensors, nbytes = step_size(units)
    shard = units_mesh(units, run.world_size)[1]
    gpu = any(lane.kind == LaneKind.GPU_STREAM for t in run.ranks for lane in t.lanes)
    if gpu or any(o is None or not o.dispatches for o in ops) or not tensors or not nbytes:
        return None
    steps, us, local = sum(o.steps for o in ops), sum(o.us for o in ops), sum(o.local_us for o in ops)
    return StepFit((us - local) / steps / tensors, local / steps / (nbytes / shard))


@dataclass(frozen=True)
class FsdpCollectiveNode:
    node: int
    kind: CommKind  # one of FSDP_KINDS: all-gather, reduce-scatter, all-reduce (HSDP, across replicas)
    unit: str
    prefetched: bool
    prefetched_by: str = ""  # the unit whose hook issued it early


def refuse_untimed_roots(g: Graph, what: str) -> None:
    """One line where ``what`` re-lays units and some are another ``fully_shard`` root's, whose compute no layer holds
    (``FsdpGraphUnit.untimed_root``; their names may repeat the profiled model's): not modelled. Units of roots timed
    beside the first (``FsdpGraphUnit.root``) are re-laid within their own root."""
    foreign = [u for u in g.meta.fsdp.units if u.untimed_root] if is_fsdp_graph(g) else []
    if foreign:
        raise DagprofError(f"{what}: {len(foreign)} FSDP units belong to a fully_shard root besides the profiled model "
                           f"({', '.join(sorted({u.untimed_root for u in foreign}))}) whose layers were not timed: re-laying units "
                           "is not modelled for it; modelled: --bandwidth, --latency, --compute-speed, --workers, --reduce-dtype")


def refuse_several_roots(g: Graph, what: str, why: str) -> None:
    """One line where ``what`` cannot be answered root by root on a job of several timed ``fully_shard`` roots: ``why``."""
    roots = {u.root for u in g.meta.fsdp.units} if is_fsdp_graph(g) else set()
    if len(roots) > 1:
        raise DagprofError(f"{what}: this job has {len(roots)} fully_shard roots (a GAN's two models, a teacher beside a "
                           f"student): {why}; modelled on it: --bandwidth, --latency, --compute-speed, --workers, --reduce-dtype, "
                           "--reshard-after-forward, --units, --data-parallel ddp, dagprof optimize", g.meta.source)


def refuse_post_forward(g: Graph, what: str, units: list[str] | None = None) -> None:
    """One line where ``what`` would move a unit given ``reshard_after_forward=N`` (an int below its shard degree; among
    ``units`` where given): its backward all-gather runs in a post-forward group of N ranks, which the mesh and unit
    passes do not regroup, and True would gather it in all its shard group's ranks, which is not priced."""
    u = next((u for u in g.meta.fsdp.units if u.reshard_to and (units is None or u.name in units)), None) if is_fsdp_graph(g) else None
    if u is not None:
        raise DagprofError(f"unit {u.name} reshards to {u.reshard_to} of its {u.mesh[-1] if u.mesh else '?'} ranks after forward "
                           f"(reshard_after_forward={u.reshard_to}): {what} is not modelled for it (its backward all-gathers' "
                           "group); modelled: --bandwidth, --latency, --compute-speed, --reduce-dtype, --reshard-after-forward off, "
                           "--workers of plain FSDP (a shard degree N divides)")


def check_post_forward_workers(g: Graph, shard: int) -> None:
    """``--workers`` giving plain FSDP a shard degree of ``shard``, where a unit was given ``reshard_after_forward=N``:
    FSDP2 keeps the int (``_fsdp_init._get_post_forward_mesh_info``: the post-forward mesh is the shard mesh viewed as
    rows of N ranks), so its backward all-gathers stay in N-rank groups and its post-forward shard 1/N of it; a shard
    degree of N makes it True (the same N-rank gathers, no post-forward shard beside). One that N does not divide, or
    below N, FSDP2 refuses (ValueError): refused here too; HSDP (the post-forward mesh flattens the replicate
    dimension into it) is not modelled."""
    for u in g.meta.fsdp.units if is_fsdp_graph(g) else []:
        if not u.reshard_to:
            continue
        if len(u.mesh) > 1:
            refuse_post_forward(g, f"--workers {shard} on HSDP")
        if shard % u.reshard_to:
            raise DagprofError(f"unit {u.name} was given reshard_after_forward={u.reshard_to}, which FSDP2 refuses on a shard degree "
                               f"of {shard} (an int must divide it): --workers {shard} is no job this script runs")


def fsdp_collectives(g: Graph) -> list[FsdpCollectiveNode]:
    """The shared collective nodes of an FSDP graph, by kind (``comm_kind``; the job's own ``full_tensor`` gathers are
    none of FSDP's: ``CommRole.JOB``) and unit (from the name, ``traces.fsdp_run.collective_name``:
    ``"<kind> <unit>[ (prefetched by <unit>)].<seq>"``); none in another graph (a DDP one's all-reduces are no FSDP's)."""
    out: list[FsdpCollectiveNode] = []
    if not is_fsdp_graph(g):
        return out
    shared = (g.kind == Kind.COMM) & (g.rank < 0) & np.isin(g.comm_kind, FSDP_KINDS) & (g.role != CommRole.JOB)
    for v in np.flatnonzero(shared).tolist():
        rest = g.node_name(v).rpartition(".")[0].partition(" ")[2]  # the builder appends ".<seq>"
        unit, _, by = rest.partition(" (prefetched by ")
        out.append(FsdpCollectiveNode(v, CommKind(int(g.comm_kind[v])), unit, bool(by), by.removesuffix(")")))
    return out


def job_collective_steps(g: Graph) -> np.ndarray:
    """Steps holding a collective of the job's own (``traces.fsdp_run.collective_name``: a ``DTensor.full_tensor`` gather of
    a state_dict, a blocking c10d call such as a DCP save's), sorted; empty outside FSDP graphs."""
    if not is_fsdp_graph(g):
        return np.empty(0, dtype=np.int64)
    return np.unique(g.step[(g.kind == Kind.COMM) & (g.rank < 0) & (g.role == CommRole.JOB)]).astype(np.int64)


def allreduce_equivalent_bytes(g: Graph, idx: np.ndarray) -> np.ndarray:
    """Bytes of the ring all-reduce that costs what each COMM node in ``idx`` costs
    (``costmodel.topology.allreduce_equivalent_factor``: an all-gather half an all-reduce of its gathered bytes,
    gloo's reduce-scatter, an all-reduce of the whole tensor, a whole one; its transfers in Kineto are ``gloo:all_reduce``).
    The kind is the one its reader or pass set (``CommKind``): a TensorFlow all-gather of an embedding's sparse gradient
    priced as an all-reduce of its result made the link fitted beside the dense all-reduce twice as fast as the wire
    (592 Mbit/s on a 500 Mbit/s testbed link). A broadcast's and an all-to-all's factor depend on the ranks the link
    model prices and the backend (``costmodel.topology.broadcast_factor``: gloo's binomial tree; ``all_to_all_factor``), and a
    gather's or scatter's on the ranks (one rank's chunk, priced as the all-gather of every rank's: ``rooted_factor``), so
    ``--workers`` reprices them."""
    nbytes = g.nbytes[idx].astype(np.float64)
    backend = (g.meta.fsdp.backend or "gloo") if is_fsdp_graph(g) else ""
    kinds = [CommKind(k) for k in g.comm_kind[idx].tolist()]
    share = _group_share(g) if is_fsdp_graph(g) else {}
    world = _priced_ranks(g)
    post = _post_forward_share(g, idx) if is_fsdp_graph(g) else {}
    # an FSDP job's own all-gathers keep half their bytes on any N (not ``all_gather_factor``'s 2-rank 3/4): the per-kind
    # calibrations and the DDP -> FSDP rule were measured against that price, and were not re-measured with it
    on_ranks = (CommKind.BROADCAST, CommKind.ALL_TO_ALL, *ROOTED) + (() if is_fsdp_graph(g) else (CommKind.ALL_GATHER,))
    return nbytes * np.array([(allreduce_equivalent_factor(k, g.meta.backend or backend, world) if k in on_ranks
                               else allreduce_equivalent_factor(k, backend))
                              * post.get(int(v), share.get(k, 1.0)) for v, k in zip(idx.tolist(), kinds)], dtype=np.float64)


def _post_forward_share(g: Graph, idx: np.ndarray) -> dict[int, float]:
    """Node -> ``_group_share``'s ratio for the backward all-gathers among ``idx`` that ran in a unit's post-forward group
    (``reshard_after_forward=N``: N ranks, told by the ranks that issued it), which the per-kind share would price on the
    shard group: 3/4 of the bytes per link on 4 ranks where 1/2 crossed on 2."""
    post = {u.name: u.reshard_to for u in g.meta.fsdp.units if u.reshard_to}
    n = _priced_ranks(g)
    out: dict[int, float] = {}
    if not post or n < 2:
        return out
    # a shard group's share of the graph's ranks; a post-forward group holds fewer (the ratio ``passes.workers``' copies keep)
    mesh = g.meta.fsdp.units[0].mesh
    shard_share = mesh[-1] / np.prod(mesh) if mesh else 1.0
    for v in idx.tolist():
        rest = g.node_name(v).rpartition(".")[0].partition(" ")[2]
        k = post.get(rest.partition(" (prefetched by ")[0]) if g.comm_kind[v] == CommKind.ALL_GATHER else None
        if k and len(issuers(g, v)) < shard_share * g.world_size:
            out[v] = ((k - 1) / k) / ((n - 1) / n)
    return out


def refuse_replicated_by_fsdp(g: Graph, what: str) -> None:
    """``what`` (a what-if flag, the search) on a job of torch's FSDP-based ``replicate()`` (``replicate_with_fsdp``): FSDP2's
    units on its default 1-D mesh named "replicate", unsharded, each all-reduced after its backward. ``units_mesh`` reads a
    1-D mesh as the shard degree, so what changes the mesh, units or ranks would answer for sharding that never ran: refused.
    Replay, analysis and the link's what-ifs read it as it ran."""
    if is_fsdp_graph(g) and any(u.mesh_dims == ["replicate"] for u in g.meta.fsdp.units):
        raise DagprofError(f"{what}: this job's units are torch's FSDP-based replicate() (replicate_with_fsdp: FSDP2 units on a "
                           "1-D 'replicate' mesh, each all-reduced after its backward), which only the link's what-ifs answer "
                           "(--bandwidth, --latency, --link-to)", g.meta.source)


def mesh_of(g: Graph) -> tuple[int, int]:
    """(replicate, shard) degrees of an FSDP graph (``units_mesh``)."""
    return units_mesh(g.meta.fsdp.units, int(g.meta.world_size or g.world_size))


def units_mesh(units: list[FsdpGraphUnit], world: int) -> tuple[int, int]:
    """(replicate, shard) degrees of FSDP ``units`` in a job of ``world`` ranks: their mesh's (HSDP's 2-D one, or
    ``(shard,)``), else (1, every rank)."""
    mesh = units[0].mesh if units else []
    return (mesh[0] if len(mesh) == 2 else 1), (mesh[-1] if mesh else max(world, 1))


def _group_share(g: Graph) -> dict[CommKind, float]:
    """Per FSDP collective kind, a ring on its group's ranks against one on the ranks the link model prices (the
    data-parallel group size, ``passes.link_fit.priced_world_size``): (k-1)/k of the bytes cross each link on k ranks. The
    fitted latency is a fixed overhead per collective (``passes.link_fit.fit_topology``), so bytes alone carry the group size:
    HSDP's all-gathers and reduce-scatters span the shard degree, its all-reduces the replicate degree. On a 2-D mesh of
    replicate degree 1, FSDP2 still all-reduces each unit's gradients over that one rank: nothing crosses a link (share 0).
    Priced as 2-rank all-reduces, the dual encoder's 14 a step (3.3 MB, ~40 us each) set its 1 Gbit/s profile's link at
    5.5 Gbit/s, its reduce-scatters' measured time beyond that kept unscaled, and 1 Gbit/s -> 200 Mbit/s 30-34 % short."""
    n = _priced_ranks(g)
    replicate, shard = mesh_of(g)
    two_d = bool(g.meta.fsdp.units) and len(g.meta.fsdp.units[0].mesh) == 2
    if n < 2 or (replicate == 1 and shard == n and not two_d) or (replicate == shard == n):
        return {}
    return {kind: ((k - 1) / k) / ((n - 1) / n)
            for kind, k in ((CommKind.ALL_GATHER, shard), (CommKind.REDUCE_SCATTER, shard), (CommKind.ALL_REDUCE, replicate))}


def _priced_ranks(g: Graph) -> int:
    """Ranks the link model prices a collective on: the data-parallel group of a hybrid job, else every rank
    (``passes.link_fit.priced_world_size``, which this module cannot import)."""
    par = g.meta.parallel
    return par.dp_size if par is not None and par.hybrid and par.dp_size else int(g.meta.world_size or g.world_size)


def _reach(g: Graph, src: int) -> np.ndarray:
    seen = np.zeros(len(g), dtype=bool)
    stack = [src]
    while stack:
        v = stack.pop()
        for w in g.successors(v).tolist():
            if not seen[w]:
                seen[w] = True
                stack.append(w)
    return seen


def check_fsdp_edges(g: Graph) -> dict[str, int]:
    """How many instances of each FSDP ordering the graph holds; raises on the first one it lacks."""
    fs = g.meta.fsdp
    if fs is None:
        raise DagprofError("not an FSDP graph")
    layer_of = {name: k for k, name in enumerate(g.layers)}
    unit_layers = {u.name: {layer_of[n] for n in u.layers if n in layer_of} for u in fs.units}
    reshard = {u.name: u.resharded_after_forward for u in fs.units}
    counts = dict.fromkeys(("forward_waits_all_gather", "backward_all_gather_after_reshard", "reduce_scatter_after_backward",
                            "optimizer_waits_reduce_scatter", "prefetched"), 0)
    collectives = fsdp_collectives(g)
    in_pass = Passes(g)
    for c in collectives:
        step = int(g.step[c.node])
        reach = _reach(g, c.node)
        on = (g.step == step) & (g.rank >= 0)
        layers = unit_layers.get(c.unit, set())
        for r in sorted(issuers(g, c.node)):
            mine = on & (g.rank == r)
            if c.kind == CommKind.ALL_GATHER:
                phase_kind = Kind.FORWARD if in_pass.is_forward(c.node, r) else Kind.BACKWARD
                # the unit's ops after the issue (a hook on the unit's output may open its first layer's backward
                # span just before FSDP's pre-backward hook gathers: that sliver stays before the all-gather)
                issued = float(g.order[_waiter(g, c.node, r)])
                ran = [v for v in np.flatnonzero(mine & (g.kind == phase_kind)).tolist() if int(g.layer[v]) in layers]
                first = [v for v in ran if float(g.order[v]) > issued]
                # (a unit frozen whole runs no backward, yet the next unit's pre-backward prefetches it: nothing to precede)
                if ran and (not first or not reach[min(first, key=lambda v: g.order[v])]):
                    raise DagprofError(f"{g.node_name(c.node)} (step {step}) does not precede its unit's {phase_kind.name.lower()} on rank {r}")
                counts["forward_waits_all_gather" if phase_kind == Kind.FORWARD else "backward_all_gather_after_reshard"] += 1
                if c.prefetched:  # issued from the hook of the unit that runs before it: ahead of that unit's compute, or
                    # (FSDP1's BackwardPrefetch.BACKWARD_POST) after its backward, ahead of its reduce-scatter
                    by = unit_layers.get(c.prefetched_by, set())
                    at = float(g.order[_issue(g, c.node, r)])
                    ahead = [v for v in np.flatnonzero(mine & (g.kind == phase_kind)).tolist() if int(g.layer[v]) in by and float(g.order[v]) > at]
                    ahead += [c2.node for c2 in collectives if c2.kind == CommKind.REDUCE_SCATTER and c2.unit == c.prefetched_by
                              and int(g.step[c2.node]) == step and r in (mine2 := issuers(g, c2.node)) and float(g.order[mine2[r]]) > at]
                    if not ahead:
                        raise DagprofError(f"{g.node_name(c.node)} (step {step}) was not issued before {c.prefetched_by}'s "
                                           f"{phase_kind.name.lower()} on rank {r}")
                    counts["prefetched"] += 1
            elif c.kind in (CommKind.REDUCE_SCATTER, CommKind.ALL_REDUCE):
                bwd = [v for v in np.flatnonzero(mine & (g.kind == Kind.BACKWARD)).tolist() if int(g.layer[v]) in layers]
                upd = np.flatnonzero(mine & (g.kind == Kind.UPDATE)).tolist()
                if c.kind == CommKind.REDUCE_SCATTER and not all(_reach(g, v)[c.node] for v in bwd):
                    raise DagprofError(f"{g.node_name(c.node)} (step {step}) does not follow its unit's backward on rank {r}")
                if not upd or not all(reach[u] for u in upd):
                    raise DagprofError(f"the optimizer step {step} on rank {r} does not wait for {g.node_name(c.node)}")
                counts["reduce_scatter_after_backward"] += c.kind == CommKind.REDUCE_SCATTER
                counts["optimizer_waits_reduce_scatter"] += 1  # and HSDP's all-reduce across replicas
    regathered = {c.unit for c in collectives if c.kind == CommKind.ALL_GATHER and not in_pass.is_forward(c.node, min(issuers(g, c.node)))}
    for unit, again in reshard.items():
        if again != (unit in regathered):
            raise DagprofError(f"unit {unit} was{'' if again else ' not'} resharded after forward but is{'' if unit in regathered else ' not'} "
                               "all-gathered again in backward")
    return counts


def _issue(g: Graph, node: int, rank: int) -> int:
    return issuers(g, node)[rank]


def issuers(g: Graph, node: int) -> dict[int, int]:
    """rank -> its enqueue of a shared collective (what its join waits for): the ranks of its group."""
    out = {}
    for p in g.predecessors(node).tolist():
        for q in ([p] if g.kind[p] != Kind.SYNC else g.predecessors(p).tolist()):
            if int(g.rank[q]) >= 0:
                out.setdefault(int(g.rank[q]), int(q))
    return out


def _waiter(g: Graph, node: int, rank: int) -> int:
    """``rank``'s op that waited for a shared collective (where its thread blocked on it)."""
    v = next((int(v) for v in g.successors(node).tolist() if int(g.rank[v]) == rank), None)
    if v is None:
        raise DagprofError(f"{g.node_name(node)}: nothing on rank {rank} waits for it (its unit's compute does not depend on it)")
    return v


def _recomputed(layer: np.ndarray, starts: np.ndarray, fwd: np.ndarray) -> np.ndarray:
    """Of ``starts`` (a forward right after a backward, in one rank's step in program order; ``layer`` per op, ``fwd``
    whether it is a forward), those that are activation checkpointing's recomputation inside the backward, not a new
    micro-batch: a new pass runs the model's forward whole, beginning with the layer the step's first pass began with
    and ending with the one it ended with (the head); a recomputation runs a checkpointed block's layers only (the end
    tells them apart where the model's first module is itself checkpointed: ``gnn_ckpt_eval.py --checkpoint-first``).
    Read as micro-batches, a GPT block calling ``torch.utils.checkpoint`` (``bench/fsdp_fresh/gpt_tied_ckpt.py``) held
    phantom accumulated gradients in its peak, and ``--units merge:2`` kept the merged blocks' reduce-scatters apart.
    A part may hold no backward at all (a forward-only FSDP module's, DINO's teacher's: ``dino_ema_teacher.py``)."""
    out = np.zeros(len(starts), dtype=bool)
    idx = np.flatnonzero(starts)
    if len(idx):
        back = np.r_[np.flatnonzero(~fwd), len(fwd)]  # each run's first backward after it (none: it goes on to the end)
        ends = back[np.searchsorted(back, idx)] - 1
        out[idx] = (layer[idx] != layer[idx[0]]) | (layer[ends] != layer[ends[0]])
    return out


class Passes:
    """Every rank's forward and backward ops per step in program order, with their micro-batch (0, 1, ..), found in one
    sort of the graph: the what-ifs ask where many points fall (per collective, per op), each a binary search then
    instead of a scan of the whole graph.

    Gradient accumulation runs several forward+backward passes per optimizer step (FSDP2's
    ``set_requires_gradient_sync(False)``, FSDP1's ``no_sync``): each forward that follows a backward starts one."""

    def __init__(self, g: Graph):
        self.g = g
        comp = np.flatnonzero((g.kind == Kind.FORWARD) | (g.kind == Kind.BACKWARD))
        if not len(comp):  # every collective would be called forward: a backward re-gather kept, unsaid
            raise DagprofError("cannot tell the FSDP collectives of forward from those of backward: no layer's forward or backward "
                               "is in this profile (a model under torch.compile runs its modules without their hooks)")
        comp = comp[np.lexsort((g.order[comp], g.step[comp], g.rank[comp]))]  # stable: ties keep the nodes' order
        rank, step = g.rank[comp], g.step[comp]
        cuts = np.flatnonzero((rank[1:] != rank[:-1]) | (step[1:] != step[:-1])) + 1
        self._of: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # the layers activation checkpointing ran forward again inside a backward (a forward after a backward of its pass)
        self.recomputed: set[int] = set()
        for part in np.split(comp, cuts) if len(comp) else []:
            fwd = g.kind[part] == Kind.FORWARD
            starts = fwd & np.r_[True, ~fwd[:-1]]
            starts[_recomputed(g.layer[part], starts, fwd)] = False
            micro = np.maximum(np.cumsum(starts) - 1, 0)
            self._of[(int(g.rank[part[0]]), int(g.step[part[0]]))] = (part, g.order[part].astype(np.float64), micro)
            last_back = np.maximum.accumulate(np.where(~fwd, np.arange(len(part)), -1))
            again = fwd & (last_back >= 0) & (micro[np.maximum(last_back, 0)] == micro)
            self.recomputed.update(int(x) for x in g.layer[part[again]])

    def most_micro_batches(self) -> int:
        """The most forward+backward passes one rank ran in one step (1: no gradient accumulation)."""
        return max((int(micro[-1]) + 1 for _, _, micro in self._of.values() if len(micro)), default=1)

    def at(self, rank: int, step: int, order: float, after: bool) -> tuple[int, bool]:
        """(micro-batch, forward?) of a point of ``rank``'s program in ``step``: that of its next forward or backward op
        (``after``; an all-gather, a copy-out: what they gather for) or its previous one (a reduce-scatter: what it reduces)."""
        if (rank, step) not in self._of:
            return 0, True
        comp, orders, micro = self._of[(rank, step)]
        i = int(np.searchsorted(orders, order))
        j = (i if i < len(comp) else i - 1) if after else (i - 1 if i > 0 else 0)
        return int(micro[j]), bool(self.g.kind[comp[j]] == Kind.FORWARD)

    def of_collective(self, node: int, rank: int) -> tuple[int, bool]:
        """(micro-batch, forward?) of a shared FSDP collective on ``rank``: an all-gather's is that of the compute that
        follows the wait for it, a reduce-scatter's (an all-reduce's) that of the backward before its issue."""
        g = self.g
        gather = g.comm_kind[node] == CommKind.ALL_GATHER
        at = _waiter(g, node, rank) if gather else _issue(g, node, rank)
        return self.at(rank, int(g.step[node]), float(g.order[at]), after=gather)

    def is_forward(self, node: int, rank: int) -> bool:
        """An all-gather belongs to the forward when the compute ``rank`` runs after waiting for it is a forward op."""
        return self.of_collective(node, rank)[1]


def max_in_flight(g: Graph, start: np.ndarray, end: np.ndarray) -> int:
    """Most all-gathers of one process group running at once in a replay (``start``/``end`` per node)."""
    groups: dict[frozenset, list[tuple[float, int]]] = {}
    for c in fsdp_collectives(g):
        if c.kind == CommKind.ALL_GATHER:
            ev = groups.setdefault(frozenset(issuers(g, c.node)), [])
            ev += [(float(start[c.node]), 1), (float(end[c.node]), -1)]
    most = 0
    for ev in groups.values():
        cur = 0
        for _, d in sorted(ev):
            cur += d
            most = max(most, cur)
    return most
