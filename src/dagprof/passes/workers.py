"""Scale the job to N workers from the profiled ranks, without re-profiling.

Data-parallel ranks run the same program, so a new rank is a copy of a profiled one
(rank r' copies rank r' mod N0). Two equivalent ways:
- ``replicate``: really add the copies (needed before ``expand_collectives`` puts
  per-link messages in the graph, and to see per-rank timelines); cost grows with N;
- fold (default for large N): keep the profiled ranks and only tell the collectives
  they span N ranks. In the coarse graph every copy of a rank would replay exactly
  like its original (same inputs, same join), so the prediction is identical at a
  cost independent of N (4,096 ranks answer as fast as 2).

A hybrid job (``graph.meta.parallel``: tensor, pipeline or expert groups beside data parallelism) is
DP replicas of ``replica_ranks`` ranks each: N workers mean N / replica_ranks replicas, so only the
data-parallel collectives are re-priced for the new DP degree; the other groups keep their size and
measured traffic. Whatever the labels cannot support (collectives of unknown dimension, no
data-parallel collective at all, a group that spans data-parallel ranks too) is refused in one line.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace

import msgspec
import numpy as np

from ..errors import DagprofError
from ..graph.build_ps import exchange_nodes, is_ps_graph, rebuild_ps
from ..graph.dag import NODE_COLUMNS, Device, Graph, GraphBuilder, csr_graph
from ..traces.events import CommKind, CommRole, Kind
from ..traces.parallelism import Dim
from .comm import current_scheme, current_topology, push_spread_us, retime_collectives
from .link_fit import graph_world_size, hybrid, torch_ddp
from .padded_gathers import padded_gather_bytes
from .zero import scale_zero_step

REPLICATE_UP_TO = 64  # ranks; above this ``scale_workers`` folds unless told otherwise


def scale_workers(g: Graph, workers: int, replicate: bool | None = None) -> Graph:
    """What if the job ran on ``workers`` ranks (same per-rank batch: weak scaling)?"""
    if workers < 1:
        raise DagprofError(f"workers must be >= 1, got {workers}")
    if g.meta.fine:
        raise DagprofError("scale workers before expanding collectives into per-link messages")
    dp_workers = data_parallel_degree(g, workers)
    topo = current_topology(g).with_workers(dp_workers)
    spec = current_scheme(g)
    n0 = graph_world_size(g)
    if is_ps_graph(g):
        return _scale_ps_workers(g, workers)
    if g.world_size != n0:
        raise DagprofError(f"graph is already folded ({g.world_size} of {n0} ranks present); scale the unfolded graph")
    if replicate is None:
        replicate = workers <= REPLICATE_UP_TO
    if replicate and workers != n0:
        out = _copy_ranks(g, np.arange(workers) % n0)
    else:
        out = _copy_ranks(g, np.arange(workers)) if workers < n0 else g
    if g.meta.zero is not None and workers != n0:  # ZeRO-1: each rank steps its own shard of the optimizer state
        folded = out.world_size < workers
        out = scale_zero_step(out, g.meta.zero, n0, workers,
                              {r: list(range(r, workers, n0)) if folded else [r] for r in range(out.world_size)})
    out = _gathered_sparse(out, workers, n0)
    par = out.meta.parallel
    out = out.replace(meta=out.meta.replace(world_size=workers, parallel=par if par is None else replace(par, dp_size=dp_workers, world_size=workers)))
    # a DDP graph already priced (whatif's model of the profiled run) keeps each collective's own time beside its price
    return retime_collectives(out, topo, spec, lags_on=current_topology(g), keep_own=g.meta.topology is not None and torch_ddp(g))


def _gathered_sparse(g: Graph, workers: int, n0: int) -> Graph:
    """A sparse gradient's all-gathers (``CommRole.SPARSE``: DDP's sparse buckets, TensorFlow's and Horovod's gathers of
    indices and values) gather every rank's rows, and so do a comm hook's all-gathers of a bucket (``CommRole.HOOK``, a
    top-k hook's values and indices): ``workers / n0`` times the ranks gather that many times the bytes, where an
    all-reduce's stay the same. TF's gathers padded to the workers' most rows are priced from the profiled workers' own
    counts (``passes.padded_gathers``): the most over more workers grows faster than their number."""
    sel = (g.kind == Kind.COMM) & (g.rank < 0) & ((g.role == CommRole.SPARSE) | ((g.role == CommRole.HOOK) & (g.comm_kind == CommKind.ALL_GATHER)))
    if workers == n0 or not sel.any():
        return g
    nbytes = g.nbytes.copy()
    nbytes[sel] = np.round(nbytes[sel] * (workers / n0)).astype(nbytes.dtype)
    if g.meta.padded_gathers:
        sized = np.flatnonzero(sel & (g.nbytes > 0))
        for v, b in padded_gather_bytes(g.names, g.name, g.step, sized, g.meta.padded_gathers, workers).items():
            nbytes[v] = b
    return g.replace(nbytes=nbytes)


def refuse_degree(g: Graph, dim: Dim, degree: int, flag: str) -> None:
    """A new tensor/pipeline/expert degree is not modelled: one line naming ``flag`` saying so (the profiled degree is accepted)."""
    par = g.meta.parallel
    # a dagprof run times the collectives no hook saw inside the ops that issued them, labelled by their group (``in_op_groups``)
    inside = {len(x.group.split(",")) for x in par.in_op_groups if x.dim == dim.text and x.group} if par is not None else set()
    sizes = sorted({len(x.ranks) for x in par.groups if dim.text in x.dims and x.ranks} | inside) if par is not None else []
    present = par is not None and (any(dim.text in x.dims for x in par.groups) or bool(inside))
    # a dagprof run of a hybrid job records its data-parallel collectives only: the replica's other dimensions are unseen
    unseen = par is not None and not present and par.mesh_dims <= {Dim.DP} and 0 < par.dp_size < par.world_size and not par.dp_mesh
    if sizes == [degree] or (not present and not unseen and degree == 1):
        return
    profiled = ("/".join(map(str, sizes)) if sizes else f"not recorded: the trace does not say which ranks its {dim.text} groups hold"
                if present else f"{par.world_size // par.dp_size} ranks per data-parallel replica, "
                "which dimension they hold not recorded: a dagprof run times their collectives inside the model's ops"
                if unseen else "1 (no such collective in the trace)")
    raise DagprofError(f"a {dim.text} degree of {degree} is not modelled (profiled: {profiled}): the graph keeps the profiled "
                       f"{dim.text} groups and their measured traffic; only the data-parallel degree (--workers) is scaled", flag)


def replica_ranks(g: Graph) -> int:
    """Ranks of one data-parallel replica: 1 for a data-parallel job, the TP x PP (x EP) ranks of a hybrid one."""
    if not hybrid(g):
        return 1
    dp = g.meta.parallel.dp_size
    return graph_world_size(g) // dp if dp else graph_world_size(g)


def data_parallel_degree(g: Graph, workers: int) -> int:
    """The DP group size ``workers`` ranks give, or a one-line refusal of what is not modelled."""
    par = g.meta.parallel
    comm = (g.kind == Kind.COMM) & (g.rank < 0)
    if par is None or not comm.any():
        return workers
    unknown = comm & (g.dim == Dim.UNKNOWN)
    if unknown.any():
        groups = sorted({g.devices[d].name.removeprefix("group ") for d in g.device[unknown] if d >= 0})
        told = sorted({w for grp in par.groups if set(grp.dims) == {Dim.UNKNOWN.text} for w in grp.evidence if w != "nothing tells"})
        raise DagprofError(f"--workers is not modelled here: {int(unknown.sum())} of {int(comm.sum())} collectives (group "
                           f"{', '.join(groups[:4])}) cannot be told data-parallel or not: "
                           f"{told[0] if told else 'no group description, position or size says'} (see `dagprof analyze`)")
    if not par.hybrid:
        return workers
    n0, dp = graph_world_size(g), par.dp_size
    if not dp or not (comm & (g.dim == Dim.DP)).any():
        raise DagprofError(f"--workers is not modelled here: the trace has no data-parallel collective ({par.describe()}), so "
                           "more workers would add a data-parallel dimension it does not show")
    for grp in par.groups:
        other = [d for d in grp.dims if d not in (Dim.DP.text, Dim.JOB.text)]  # the job's own: kept as profiled (``passes.comm.job_comm``)
        if other and not grp.ranks and dp >= n0:  # no smaller data-parallel groups say what one replica is
            raise DagprofError(f"--workers is not modelled here: the trace does not say which ranks the {'/'.join(other)} collectives "
                               f"of group {grp.name} span ({par.describe()}), so how they change with more workers is not known")
        if other and any(len(set(grp.ranks) & set(ranks)) > 1 for ranks in par.dp_groups):
            raise DagprofError(f"--workers is not modelled here: the {'/'.join(other)} collectives of group {grp.name} span "
                               f"data-parallel ranks too ({par.describe()}), so how they change with more workers is not known")
    unit = replica_ranks(g)
    if n0 % dp or workers % unit:
        raise DagprofError(f"a hybrid job of {n0} ranks ({par.describe()}) is data-parallel replicas of {unit} ranks: "
                           f"--workers must be a multiple of {unit}, got {workers}")
    return workers // unit


def shared_port_note(g: Graph, workers: int) -> str | None:
    """A parameter-server ``--workers`` answer with more workers than profiled: each server's port is priced as a fair share of
    its bandwidth among the workers' messages, the copies of a worker in lockstep with it. Measured, the workers fall out of
    step, which moved the step either way; said in one line with both sizes, since the profile cannot show it.

    TCP streams through one FIFO port are not served evenly. On the namespace testbed (``bench/bench_mxnet_ps.py``, 2 MiB
    port queues, 3 quiet rounds) mx_mlp.py's 4 workers into 1 server at 200 Mbit/s got their pulls 30-229 ms apart, so each
    step they began pushing 40-233 ms apart (median 87; the replayed copies 8, the profiled 2 workers at 500 Mbit/s 0-29),
    and the server had every push 6-153 ms (median 87) later than its port carries 4 workers' bytes: the step ran +6 % over
    the 4-worker replay at the ports' payload rate (863 against 811 ms), where 2 workers at 200 Mbit/s came out +0 %. The
    unevenness is TCP's, not MXNet's: raw TCP in the same pattern (``--ps-pattern-check``, 3 runs, load 11-19) began 4 workers
    80-141 ms apart with every push in 64-115 ms late, 2 workers 11 ms apart and 9-30 ms late (its step, +0.3 to +7.0 %
    over lockstep at the payload rate for 4 workers and +1.3 to +7.7 % for 2, is too noisy there to say more). Nor the cores': a worker's
    last pull to its next push took a median 6-8 ms a step with 4 workers, 5-7 with 2; nor TCP's slow start after idle
    (off in every namespace: 856 and 903 ms against 869 and 850, load 11-13). mx_convnet.py's 4 workers (380 KB each a
    step) began 14-48 ms apart and came out within 6 %. Out of step can also be faster than lockstep: mx_deepfm_workers.py's
    3 workers into 1 server at 200 Mbit/s (8 rounds in two holds of the measuring lock, 2026-12-06, load 2-8) got their pulls
    33-84 ms apart in 2 of its profiles (the replayed copies 2-5) and began their next pushes as far apart, so one worker's
    pushes went into the server's port while the others' pulls still came out of it (a port's two directions carry apart): 2 -> 3 workers ran
    x1.35 / x1.39 (medians of each hold's rounds) against the x1.50 of the port's bytes in lockstep, the step 6-9 % under
    the replay (``bench/mx_before_after.py``; 2 workers at 200 Mbit/s, pulls 2-35 ms apart, within 1 %). Later rounds of the
    same cells (7 in two holds, load 2.5-3.5) came out within 3 % either side (medians over rounds; 2 -> 3 workers x1.40-1.44 against x1.49-1.51
    replayed). The port serves the workers in arrival order, partly (``bench/mx_service_order.py``: the first to push got
    its last pull first in 32 of 44 steps, the last pulls 37-45 ms apart where strict arrival order gives ~138); served
    in strict arrival order, per key or per worker, the replay moved the 3-worker cells 0-17 points down, away from the
    measurement (``bench/mx_port_order.patch``, docs/evidence.md, branch mx3w61)."""
    n0 = int(g.world_size)
    if g.meta.ps is None or workers <= n0:
        return None
    spread = push_spread_us(g, g.order)
    return (f"--workers {workers}: each server's port shared fairly by the {workers} workers in lockstep (the {n0} profiled began their "
            f"pushes {np.median(spread) / 1e3:.0f} ms apart); TCP serves streams through one port unevenly, so workers fall out of "
            "step, either way from lockstep on the 200 Mbit/s testbed (1 server: 4 mx_mlp.py workers 6 % over the replay, "
            "3 mx_deepfm_workers.py ones 6-9 % under it in one session, within 3 % in another, pushing in while others pulled)")


def in_pass_gathers(g: Graph) -> np.ndarray:
    """The job's own all-gathers of an FSDP run (``CommRole.JOB``, priced as all-gathers: its gathers and scatters too)
    that every rank issued within its step's forward and backward passes (its first forward to its last backward layer
    op): a loss's differentiable all_gather of in-batch negatives and its backward's scatters, one per rank. Each moves
    every rank's rows, so its bytes, its backward's calls and the compute on what it gathered grow with the workers."""
    shared = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.role == CommRole.JOB) & (g.comm_kind == CommKind.ALL_GATHER))
    if not len(shared):  # most jobs: no pass spans to lay out
        return shared.astype(np.int64)
    passes = np.flatnonzero((g.kind == Kind.FORWARD) | (g.kind == Kind.BACKWARD))
    spans = {}  # (rank, step) -> the passes' first start and last end
    for r, s in {(int(r), int(s)) for r, s in zip(g.rank[passes], g.step[passes])}:
        mine = passes[(g.rank[passes] == r) & (g.step[passes] == s)]
        spans[(r, s)] = (float(g.order[mine].min()), float((g.order[mine] + g.dur[mine]).max()))
    out = []
    for v in shared.tolist():
        head = [u for u in g.predecessors(v).tolist() if g.kind[u] == Kind.SYNC]  # the join of every rank's enqueue
        issued = [u for u in (g.predecessors(head[0]) if head else g.predecessors(v)).tolist() if g.rank[u] >= 0]
        if issued and all(lo <= g.order[u] <= hi for u in issued for lo, hi in [spans.get((int(g.rank[u]), int(g.step[u])), (1.0, 0.0))]):
            out.append(v)
    return np.asarray(out, dtype=np.int64)


def in_pass_gathers_note(g: Graph, workers: int) -> str | None:
    """``--workers`` other than profiled on a job whose own all-gathers ran within its passes (``in_pass_gathers``): their
    bytes and calls kept as profiled, as is the compute on what they gathered, said with their count. An HSDP dual encoder
    all-gathered its in-batch negatives over every rank and scored B x (B x W) similarities; ``--workers 8`` of its 4-rank
    profile answered at the profiled size without a word."""
    n0 = graph_world_size(g)
    found = in_pass_gathers(g) if workers != n0 else np.zeros(0, np.int64)
    if not len(found):
        return None
    kinds = Counter(g.node_name(int(v)).rsplit(".", 1)[0] for v in found)
    bound = "a lower bound on the step" if workers > n0 else "an upper bound on the step"
    return (f"--workers {workers}: {len(found)} collectives of the job's own in the {len(g.meta.steps)} profiled steps ran within the "
            f"forward and backward passes ({', '.join(f'{k} x{n}' for k, n in sorted(kinds.items()))}): each gathers every rank's rows (as "
            "a loss's differentiable all_gather of in-batch negatives does) or scatters them back, so with the ranks grow their bytes, "
            f"their backward's scatters (one per rank) and the compute on what they gathered (a loss over every rank's rows); the answer "
            f"keeps their bytes and calls at the profiled {n0} ranks' and that compute as profiled: {bound}")


def _scale_ps_workers(g: Graph, workers: int) -> Graph:
    """A parameter-server job on ``workers`` workers: each a copy of a profiled one, every key pushed by
    all of them, so more workers load the servers' ports and CPUs (no folding: the servers see each one)."""
    if workers > REPLICATE_UP_TO:
        raise DagprofError(f"a parameter-server job is scaled by copying its workers: at most {REPLICATE_UP_TO}, got {workers}")
    if g.world_size != graph_world_size(g):
        raise DagprofError("scale the unfolded graph of a parameter-server job")
    b, _ = GraphBuilder.from_graph(g, ~exchange_nodes(g))
    workers_only = b.build()
    out = _copy_ranks(workers_only, np.arange(workers) % g.world_size)
    out.meta = out.meta.replace(world_size=workers, ranks=list(range(workers)), ps=msgspec.structs.replace(g.meta.ps, num_workers=workers))
    return rebuild_ps(out, current_scheme(g).servers, current_topology(g).inter)


def _copy_ranks(g: Graph, source: np.ndarray) -> Graph:
    """A graph whose rank r is a copy of ``g``'s rank ``source[r]``; shared (rank -1) nodes kept once
    and joined to every copy."""
    shared = np.flatnonzero(g.rank < 0)
    per_rank = [np.flatnonzero(g.rank == s) for s in range(g.world_size)]
    blocks = [shared] + [per_rank[s] for s in source.tolist()]
    old_of_new = np.concatenate(blocks)
    new_rank = np.concatenate([g.rank[shared]] + [np.full(len(per_rank[s]), r, dtype=np.int32) for r, s in enumerate(source.tolist())])
    n = len(old_of_new)
    # devices: shared ones kept, each rank's own renamed for its copy
    devices = [d for d in g.devices]
    dev_ids: dict[tuple[int, int], int] = {}
    new_device = g.device[old_of_new].copy()
    offset = len(shared)
    for r, s in enumerate(source.tolist()):
        sl = slice(offset, offset + len(per_rank[s]))
        offset += len(per_rank[s])
        if r == s:
            continue
        old = new_device[sl]
        for d in np.unique(old[old >= 0]).tolist():
            key = (r, d)
            if key not in dev_ids:
                dv = g.devices[d]
                if dv.rank < 0 and not dv.name.startswith(f"rank{s}/"):
                    raise DagprofError(f"device {dv.name!r} is shared by ranks; replicate before expanding collectives")
                name = re.sub(rf"^rank{s}\b", f"rank{r}", dv.name) if dv.name.startswith(f"rank{s}") else f"rank{r}/{dv.name}"
                dev_ids[key] = len(devices)
                devices.append(Device(name, dv.kind, r, dv.capacity))
            old[old == d] = dev_ids[key]
        new_device[sl] = old
    # edges: map each old edge to all its copies
    src_old = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    dst_old = g.succ.astype(np.int64)
    src_new, dst_new = [], []
    starts = np.cumsum([len(shared)] + [len(per_rank[s]) for s in source.tolist()])
    is_shared = g.rank < 0
    # intra-rank edges, per copy
    for r, s in enumerate(source.tolist()):
        local = np.full(len(g), -1, dtype=np.int64)
        local[per_rank[s]] = starts[r] + np.arange(len(per_rank[s]))
        local[shared] = np.arange(len(shared))
        m = (local[src_old] >= 0) & (local[dst_old] >= 0) & ~(is_shared[src_old] & is_shared[dst_old])
        src_new.append(local[src_old[m]])
        dst_new.append(local[dst_old[m]])
    sh = np.full(len(g), -1, dtype=np.int64)
    sh[shared] = np.arange(len(shared))
    m = is_shared[src_old] & is_shared[dst_old]
    src_new.append(sh[src_old[m]])
    dst_new.append(sh[dst_old[m]])
    cols = {c: getattr(g, c)[old_of_new] for c in NODE_COLUMNS}
    cols["rank"] = new_rank
    cols["device"] = new_device
    meta = g.meta.copy()  # each copy's main lane is its source's, renamed (passes.compute.share_cores tells the others apart by it)
    meta.main_device = {r: dev_ids.get((r, g.meta.main_device[s]), g.meta.main_device[s])
                        for r, s in enumerate(source.tolist()) if s in g.meta.main_device}
    return csr_graph(n, np.concatenate(src_new), np.concatenate(dst_new), names=g.names, devices=devices, layers=g.layers,
                     meta=meta, ready_spread=g.ready_spread.taken(old_of_new), **cols)
