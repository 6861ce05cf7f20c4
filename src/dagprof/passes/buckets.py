"""Gradient bucketing what-ifs: bucket size (tensor fusion), overlap on/off, tensor partition.

DDP fills buckets with gradients in the order they become ready and starts a bucket's
all-reduce as soon as it is full. Re-bucketing therefore needs, per rank and step, the
BACKWARD nodes in lane order with the bytes of gradient each produces: their ``nbytes``
when the trace knows them, else each profiled bucket's bytes spread over the backward
nodes that filled it (exact for the measured boundaries, approximate inside a bucket:
profile with small buckets to re-bucket finely). Parameters no hooked module owns
(``nn.MultiheadAttention``'s in-projection, a model's own position table) are spread so
too, over the buckets their bytes are missing from. The pass drops the old enqueue, join
and transfer nodes and builds new ones per bucket; transfers are priced by the graph's
link model (``passes.comm``), enqueues reuse the measured per-call cost, and whatever
waited for the step's buckets (DDP's finalize, the optimizer) waits for the new ones.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..costmodel.collectives import allreduce_us
from ..errors import DagprofError
from ..graph.dag import Graph, GraphBuilder
from ..traces.events import CommKind, CommRole, Kind
from ..traces.zero_run import ZERO_OVERLAP_HOOK
from ..units import MB
from .comm import current_scheme, current_topology, retime_collectives, without_transfers
from .gradients import last_pass_start, unhooked
from .link_fit import find_collectives

_AFTER = 1e-3  # us: a new node's order just after the node it follows on its lane
HALF_HOOKS = ("fp16_compress_hook", "bf16_compress_hook")  # torch's casts: the collector records 2 bytes per element


def refuse_own_ddp_setup(g: Graph, what: str, wire: bool = False) -> None:
    """One line where the job's own DDP setup would make ``what`` a silent wrong answer.

    ``wire``: ``what`` re-prices the recorded collectives (another link, more workers): right under torch's fp16/bf16
    compression hooks, whose bytes on the wire the collector records, and under a hook of the job's own where the
    collector recorded the collectives it called for each bucket (``refuse_hook_wire``), refused where it did not
    (PowerSGD's chained factors, an older profile); under ZeRO's overlapped step around DDP's all-reduce (``ZERO_OVERLAP_HOOK``) a link
    what-if re-prices its all-reduces and broadcasts, which the collector sized, and ``--workers`` is refused. Otherwise
    ``what`` lays out new buckets from the gradients' bytes at DDP's all-reduce: refused under any hook of the job's own,
    and for a job that wraps several DDP models (a GAN's two)."""
    hook = g.meta.comm_hook
    if not wire and (sparse := sparse_buckets(g)):
        raise DagprofError(f"{what}: the job's {len(sparse)} sparse gradients (nn.Embedding(sparse=True)) each go in a bucket of "
                           "their own, which gloo all-gathers at the rows a step touched; new buckets are laid out from dense "
                           "gradient bytes: not modelled")
    if wire and hook == ZERO_OVERLAP_HOOK and what == "--workers":
        raise DagprofError("--workers: ZeroRedundancyOptimizer(overlap_with_ddp=True) steps and broadcasts each DDP bucket on "
                           "the rank that owns it, which more ranks would reassign: not modelled")
    if wire:
        if hook and hook not in (*HALF_HOOKS, ZERO_OVERLAP_HOOK):
            refuse_hook_wire(g, what)
        return
    if hook:
        raise DagprofError(f"{what}: the job registers its own DDP comm hook ({hook}); new buckets are priced at DDP's "
                           "plain all-reduce, and dagprof.apply would replace the hook: not modelled")
    if g.meta.ddp_models > 1:
        raise DagprofError(f"{what}: the job wraps {g.meta.ddp_models} DDP models (a GAN's generator and discriminator?); "
                           "re-bucketing and dagprof.apply handle one: not modelled")


# A hook's blocking collectives stay as measured inside its calls: past this share of the bytes it issued for later, a
# link what-if would leave too much of its wire unpriced
BLOCKING_SHARE = 0.01


def refuse_hook_wire(g: Graph, what: str) -> None:
    """One line where ``what`` cannot price the wire of the job's own DDP comm hook (``GraphMeta.hook_wire``): none
    recorded (a profile before the collector recorded them), collectives called from its futures' callbacks after its
    calls (PowerSGD's), a bucket call whose collectives were no one kind's all-reduces or all-gathers in DDP's group, or more than
    ``BLOCKING_SHARE`` of its bytes blocked on inside its calls (timed there as measured). ``--workers`` also needs each
    bucket's bytes the same from call to call and rank to rank: an all-gather whose size the data decides would gather
    what more ranks select, unknown. ``--scheme`` is refused: the hook calls its collectives itself."""
    hook, w = g.meta.comm_hook, g.meta.hook_wire
    if what == "--scheme":
        raise DagprofError(f"--scheme: the job's DDP comm hook ({hook}) calls its own collectives; another collective scheme "
                           "would need the hook written for it: not modelled")
    if w is None:
        raise DagprofError(f"{what}: the job registers its own DDP comm hook ({hook}), whose bytes on the wire are not "
                           "recorded: not modelled")
    if w.late:
        raise DagprofError(f"{what}: the job's DDP comm hook ({hook}) called {w.late} collectives from its futures' callbacks, "
                           "after its calls (PowerSGD's later all-reduces), which no bucket's record holds: not modelled")
    if w.unpriced:
        raise DagprofError(f"{what}: the job's DDP comm hook ({hook}) put no one kind's all-reduces or all-gathers in DDP's "
                           f"group on the wire in {w.unpriced} of its {w.calls} bucket calls (kinds seen: {', '.join(w.kinds) or 'none'}): "
                           "not modelled")
    if w.blocking_bytes > BLOCKING_SHARE * w.issued_bytes:
        raise DagprofError(f"{what}: the job's DDP comm hook ({hook}) blocked on {w.blocking} collectives of its own inside its "
                           f"calls ({w.blocking_bytes} B per rank against {w.issued_bytes} B issued for later), which stay as "
                           "measured there: not modelled")
    if what == "--workers" and w.varying:
        raise DagprofError(f"--workers: the job's DDP comm hook ({hook}) put other bytes on the wire for a bucket from call to "
                           "call or rank to rank (a size its data decides), which other ranks would change: not modelled")


def hook_wire_note(g: Graph) -> str | None:
    """What a link or worker what-if under the job's own DDP comm hook leaves as measured (None: no such hook priced)."""
    w, hook = g.meta.hook_wire, g.meta.comm_hook
    if w is None or not hook or hook in (*HALF_HOOKS, ZERO_OVERLAP_HOOK):
        return None
    latency = f"; a call's {w.most} collectives are priced as one transfer of their bytes (one latency)" if w.most > 1 else ""
    blocking = (f"; its {w.blocking} blocking collectives inside its calls ({w.blocking_bytes / w.calls:.0f} B a call) stay as measured "
                "(on a slower link they share it with the transfers in flight: not modelled)"
                if w.blocking else "")
    return (f"the job's DDP comm hook ({hook}): each bucket priced at the {'/'.join(w.kinds)} it issued ({w.issued_bytes / w.calls:.0f} B "
            f"per rank a call, {w.calls} calls){latency}{blocking}; its own compute stays as measured in its calls, and what its future's "
            "callbacks do is in the transfer spans the link was fitted to: neither grows with --workers (an all-gather's "
            "callbacks would handle more ranks' rows)")


def sparse_buckets(g: Graph) -> set[int]:
    """The DDP buckets whose collective all-gathers a sparse gradient (``CommRole.SPARSE``); none in a Horovod graph,
    whose bucket is a fused response's position."""
    if g.meta.horovod is not None:
        return set()
    return set(np.unique(g.bucket[(g.kind == Kind.COMM) & (g.rank < 0) & (g.bucket >= 0) & (g.role == CommRole.SPARSE)]).tolist())


@dataclass
class ProfiledBuckets:
    """The gradient-bucket collectives of a graph, and what a re-bucketing pass needs of them."""

    comm_ids: list[int]  # each bucket's shared transfer node
    enqueue: np.ndarray  # bool mask: the ranks' enqueue nodes
    coll_of_enq: dict[int, int]  # enqueue node -> its transfer node
    sinks: dict[tuple[int, int], set[int]]  # (step, rank) -> nodes that wait for the step's buckets
    drop: np.ndarray  # bool mask: every node of the profiled buckets (transfers, joins, enqueues)
    enq_dur: float  # median measured enqueue cost
    enq_gap: float
    comm_gap: float


def profiled_buckets(g: Graph) -> ProfiledBuckets:
    colls = [c for c in find_collectives(g) if g.bucket[c.comm] >= 0]  # gradient buckets, not buffer broadcasts
    if not colls:
        raise DagprofError("the trace has no gradient-bucket all-reduce to re-bucket (a stock torch.profiler trace does not say "
                           "which all-reduce carries which DDP bucket; a dagprof profile of a DDP job does)", g.meta.source)
    enq = np.zeros(len(g), dtype=bool)
    drop = np.zeros(len(g), dtype=bool)
    coll_of_enq: dict[int, int] = {}
    sinks: dict[tuple[int, int], set[int]] = defaultdict(set)
    for c in colls:
        drop[c.comm] = True
        if c.sync >= 0:
            drop[c.sync] = True
        for v in c.ready:
            if g.kind[v] == Kind.COMM_ENQUEUE:
                enq[v] = True
                coll_of_enq[v] = c.comm
        for v in c.consumers:
            if int(g.rank[v]) >= 0:
                sinks[(int(g.step[c.comm]), int(g.rank[v]))].add(v)
    drop |= enq
    comm_ids = [c.comm for c in colls]
    med = lambda x: float(np.median(x)) if len(x) else 0.0  # noqa: E731
    return ProfiledBuckets(comm_ids, enq, coll_of_enq, sinks, drop, med(g.dur[enq]), med(g.gap[enq]), med(g.gap[comm_ids]))


def set_buckets(g: Graph, cap_bytes: float | None = None, overlap: bool = True, first_bucket_bytes: float | None = None) -> Graph:
    """Re-bucket gradients with ``cap_bytes`` (None: keep the measured buckets).

    ``overlap=False`` starts every all-reduce after the step's last BACKWARD node
    (no wait-free back-propagation). ``first_bucket_bytes`` caps the first bucket only: DDP
    uses 1 MiB there when ``bucket_cap_mb`` is left at its default, else the cap itself.
    """
    if cap_bytes is not None and not cap_bytes > 0:
        raise DagprofError(f"bucket size must be positive, got {cap_bytes} bytes")
    pb = profiled_buckets(g)
    topo, spec = current_topology(g), current_scheme(g)
    old_enq, coll_of_enq, sinks, drop = pb.enqueue, pb.coll_of_enq, pb.sinks, pb.drop
    enq_dur, enq_gap, comm_gap, comm_ids = pb.enq_dur, pb.enq_gap, pb.comm_gap, pb.comm_ids
    comm_dev = int(g.device[comm_ids[0]])

    b, remap = GraphBuilder.from_graph(g, ~drop)
    groups = _groups(g, old_enq, coll_of_enq, cap_bytes, first_bucket_bytes)
    per_step: dict[int, dict[int, list[tuple[int, int]]]] = defaultdict(dict)  # step -> rank -> [(last bw, nbytes)]
    for (step, rank), grp in groups.items():
        per_step[step][rank] = grp
    ranks_present = sorted(int(r) for r in g.ranks())
    for step, by_rank in sorted(per_step.items()):
        counts = {len(v) for v in by_rank.values()}
        if len(counts) != 1 or sorted(by_rank) != ranks_present:
            raise DagprofError(f"step {step}: ranks disagree on the gradient layout; cannot re-bucket")
        for k in range(counts.pop()):
            nbytes = by_rank[ranks_present[0]][k][1]
            sync = b.add_node(f"sync s{step} b{k}", Kind.SYNC, step=step, bucket=k)
            ready_order = -np.inf
            for r in ranks_present:
                last_bw = by_rank[r][k][0] if overlap else by_rank[r][-1][0]
                o = float(g.order[last_bw]) + _AFTER * (k + 1)
                enq = b.add_node(f"enqueue s{step} b{k}", Kind.COMM_ENQUEUE, rank=r, device=int(g.device[last_bw]), dur=enq_dur,
                                 gap=enq_gap, order=o, step=step, bucket=k)
                b.add_edge(int(remap[last_bw]), enq)
                b.add_edge(enq, sync)
                ready_order = max(ready_order, o)
            comm = b.add_node(f"allreduce s{step} b{k}", Kind.COMM, device=comm_dev, dur=allreduce_us(nbytes, topo, spec),
                              gap=comm_gap, order=ready_order, step=step, bucket=k, nbytes=int(nbytes), comm_kind=CommKind.ALL_REDUCE)
            b.add_edge(sync, comm)
            for r in ranks_present:
                for v in sinks.get((step, r), ()):
                    b.add_edge(comm, int(remap[v]))
    chain_lanes(b)
    out = b.build()
    if cap_bytes is not None:
        out.meta.bucket_cap_mb = cap_bytes / MB
    out.meta.overlap = overlap
    return retime_collectives(out, topo, spec, lags_on=topo)


def _groups(g: Graph, old_enq: np.ndarray, coll_of_enq: dict[int, int], cap: float | None, first: float | None) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(step, rank) -> buckets as (last BACKWARD node, nbytes), in gradient-ready order."""
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    # the backward ops on the lanes that enqueue the rank's all-reduces (DDP's hooks fire on the thread that runs the
    # backward): a GPU's kernels carry their launching layer's kind but finish in another order on their streams
    enq_lanes = np.isin(g.device, np.unique(g.device[old_enq]))  # a device is one rank's
    seq_nodes = np.flatnonzero((((g.kind == Kind.BACKWARD) & enq_lanes) | old_enq) & (g.rank >= 0) & (g.step >= 0))
    by_key: dict[tuple[int, int], list[int]] = defaultdict(list)
    for v in seq_nodes[np.argsort(g.order[seq_nodes], kind="stable")].tolist():
        by_key[(int(g.step[v]), int(g.rank[v]))].append(v)
    # gradients of parameters no layer of the graph owns (``_measured_buckets``); under find_unused_parameters=True a
    # layer without nodes may be one the step left unused, its zeros all-reduced (refused below), so none is assumed
    hooked = set(g.layers)
    orphan = 0 if g.meta.find_unused else sum(nb for path, nb in g.meta.layer_grad_bytes.items() if path not in hooked)
    weight = _alike_weights(g, by_key)
    for key, seq in by_key.items():
        measured, grad_bytes = _measured_buckets(g, *_synced_pass(g, seq, old_enq, key), old_enq, coll_of_enq, orphan, weight)
        made, whole = sum(grad_bytes.values()), sum(nb for _, nb in measured)
        if cap is not None and g.meta.find_unused and made < 0.99 * whole:
            raise DagprofError(f"step {key[0]}: under find_unused_parameters=True DDP all-reduced {whole / MB:.2f} MB of buckets, "
                               f"{made / MB:.2f} MB of it gradients made that step (the unused parameters' are all-reduced as "
                               "zeros): re-bucketing such a step is not modelled")
        if cap is None:
            buckets = [(grp[-1], nb) for grp, nb in measured]
        else:
            buckets = _filled([v for grp, _ in measured for v in grp], grad_bytes, cap, first, g.meta.find_unused)
        if buckets:
            out[key] = buckets
    if not out:
        raise DagprofError("no BACKWARD node precedes a bucket all-reduce in the profiled steps; cannot re-bucket" + unhooked(g))
    return out


def _filled(nodes: list[int], grad_bytes: np.ndarray, cap: float, first: float | None, never_rebuilt: bool) -> list[tuple[int, int]]:
    """Buckets of the gradients ``nodes`` make (in ready order) as (last node, bytes), each closed at the node that brings it
    to its limit (``first`` for the first built). DDP with ``find_unused_parameters=True`` (``never_rebuilt``) builds them
    once from the parameters in registration order, the reverse of ready order: filled from the other end, so the bucket
    left short is the first ready, not the last (``passes.gradients.gradient_order``)."""
    filled = nodes[::-1] if never_rebuilt else nodes
    # a bucket is ready at its last node in ready order: filled from the other end, its first
    built = [(filled[start if never_rebuilt else stop - 1], int(round(acc)))
             for start, stop, acc in fill_buckets([grad_bytes[v] for v in filled], cap, first)]
    return built[::-1] if never_rebuilt else built


def fill_buckets(sizes: list, cap: float, first: float | None) -> list[tuple[int, int, float]]:
    """DDP's ``Reducer`` rule on gradients of ``sizes`` bytes in the order it fills its buckets: each bucket closed at the
    gradient that brings it to its limit (``first`` for the first, None: ``cap``; ``cap`` after), the rest in a last one
    where it holds bytes. As (start, stop, bytes) over ``sizes``: ``_filled`` on graph nodes, ``passes.fsdp_to_ddp`` on
    the modules that own gradients."""
    out, start, acc = [], 0, 0
    for k, nb in enumerate(sizes):
        acc += nb
        if acc >= (cap if out or first is None else first):
            out.append((start, k + 1, acc))
            start, acc = k + 1, 0
    if acc > 0:
        out.append((start, len(sizes), acc))
    return out


def _synced_pass(g: Graph, seq: list[int], old_enq: np.ndarray, key: tuple[int, int]) -> tuple[list[int], np.ndarray]:
    """The BACKWARD and enqueue nodes of the one backward pass of a step that all-reduces, in lane order, and the nodes'
    gradient bytes.

    Under gradient accumulation the passes before the last (``gradients.last_pass_start``) are left out, and the
    gradient bytes counted on a layer's first backward of the step are carried to its first node in the last pass (to
    the pass's end for a layer with none there). A bucket all-reduced twice in a step (two losses, a GAN's two DDP
    models) is refused: the pass re-buckets one synchronising backward per step."""
    enq_buckets = [int(g.bucket[v]) for v in seq if old_enq[v]]
    if len(set(enq_buckets)) < len(enq_buckets):
        raise DagprofError(f"step {key[0]} all-reduces a gradient bucket more than once (two losses, two DDP models such "
                           "as a GAN's, or an optimizer step not taken, as a GradScaler skips one whose gradients overflowed, "
                           "folding two iterations into one step): re-bucketing is modelled for one backward pass per step",
                           g.meta.source)
    backward = [v for v in seq if g.kind[v] == Kind.BACKWARD and g.layer[v] >= 0]
    start = last_pass_start(g, backward)
    if start == -np.inf:
        return seq, g.nbytes
    by_layer: dict[int, list[int]] = defaultdict(list)
    for v in backward:
        by_layer[int(g.layer[v])].append(v)
    last = [v for v in backward if g.order[v] >= start]
    nbytes = g.nbytes.copy()
    for vs in by_layer.values():
        carried = int(g.nbytes[vs].max())
        here = [v for v in vs if g.order[v] >= start]
        nbytes[vs] = 0
        nbytes[here[0] if here else last[-1]] += carried
    return [v for v in seq if old_enq[v] or g.order[v] >= start], nbytes


def _alike_weights(g: Graph, by_key: dict[tuple[int, int], list[int]]) -> np.ndarray:
    """Per node, the backward time ``_by_time`` spreads bytes by: a node's mean over every (step, rank) whose sequence
    runs the same layers in the same order, at its place there (its own time elsewhere).

    DDP's buckets are the same on every rank and step; spread by each node's own time, a root's parameter outside every
    layer (a capsule net's routing weights, ``bench/ddp_fresh/capsnet_scaler.py``) moved from layer to layer with the
    ranks' timings, so ``--bucket-mb 1`` closed 3 buckets on one rank and 2 on the other and refused the run."""
    weight = g.dur.astype(float).copy()
    alike: dict[tuple[int, ...], list[list[int]]] = defaultdict(list)
    for seq in by_key.values():
        bw = [v for v in seq if g.kind[v] == Kind.BACKWARD]
        alike[tuple(int(g.layer[v]) for v in bw)].append(bw)
    for seqs in alike.values():
        at = np.array(seqs, dtype=np.int64)
        if at.size:
            weight[at] = g.dur[at].mean(axis=0)
    return weight


def _measured_buckets(g: Graph, seq: list[int], nbytes: np.ndarray, old_enq: np.ndarray, coll_of_enq: dict[int, int],
                      orphan: int = 0, weight: np.ndarray | None = None) -> tuple[list[tuple[list[int], int]], dict[int, float]]:
    """The profiled buckets of one rank's step as (BACKWARD nodes before each enqueue, bucket bytes),
    and each BACKWARD node's gradient bytes: its ``nbytes`` when the trace has it (counted once per
    layer), else its bucket's bytes spread over the bucket's nodes in proportion to backward time.

    ``orphan``: the gradient bytes of parameters that no layer of the graph owns (a module with children that holds
    its own, as ``nn.MultiheadAttention``; a leaf whose forward never ran as a module call, as its ``out_proj``). No
    node carries them, so a bucket's layers fall short of its bytes by theirs: each shortfall, up to ``orphan`` in all,
    is spread over that bucket's nodes as an unknown bucket's bytes are (without it, re-bucketing lost them).
    ``weight``: the time each node's share is in proportion to (``_alike_weights``; default its own)."""
    w = g.dur if weight is None else weight
    groups: list[tuple[list[int], int]] = []
    cur: list[int] = []
    for v in seq:
        if old_enq[v]:
            if cur:
                groups.append((cur, int(g.nbytes[coll_of_enq[v]])))
                cur = []
        else:
            cur.append(v)
    if cur and groups:  # backward after the last enqueue: no gradient of its own
        groups[-1][0].extend(cur)
    grad: dict[int, float] = {}
    known = all(nbytes[v] > 0 or g.layer[v] >= 0 for grp, _ in groups for v in grp) and any(nbytes[v] > 0 for grp, _ in groups for v in grp)
    seen: set[int] = set()
    left = orphan
    for grp, nb in groups:
        if known:
            for v in grp:
                lay = int(g.layer[v])
                grad[v] = float(nbytes[v]) if lay < 0 or lay not in seen else 0.0
                seen.add(lay)
            short = min(left, nb - int(sum(grad[v] for v in grp)))
            if short > 0:
                left -= short
                for v, x in zip(grp, _by_time(w, grp, short)):
                    grad[v] += x
        else:
            for v, x in zip(grp, _by_time(w, grp, nb)):
                grad[v] = x
    return groups, grad


def _by_time(dur: np.ndarray, nodes: list[int], nbytes: int) -> list[float]:
    """``nbytes`` over ``nodes`` in proportion to their backward time ``dur`` (evenly where none was timed), in whole bytes."""
    w = dur[nodes] if dur[nodes].sum() > 0 else np.ones(len(nodes))
    share = np.floor(w / w.sum() * nbytes)
    share[-1] += nbytes - share.sum()
    return share.tolist()


def main_lane(g: Graph, step: int, rank: int) -> np.ndarray:
    """The nodes of ``rank``'s main lane (``GraphMeta.main_device``; every device of the rank where not recorded) in
    ``step``, in program order."""
    dev = g.meta.main_device.get(rank)
    sel = (g.step == step) & (g.rank == rank) & ((g.device == dev) if dev is not None else (g.device >= 0))
    idx = np.flatnonzero(sel)
    return idx[np.argsort(g.order[idx], kind="stable")]


def chain_lanes(b: GraphBuilder) -> None:
    """Program order on every rank's lane, restored after nodes were removed or inserted."""
    dev = np.asarray(b._cols["device"])
    rank = np.asarray(b._cols["rank"])
    order = np.asarray(b._cols["order"], dtype=float)
    idx = np.flatnonzero((dev >= 0) & (rank >= 0))
    idx = idx[np.lexsort((order[idx], dev[idx]))]
    same = dev[idx][1:] == dev[idx][:-1]
    b.add_edges(idx[:-1][same], idx[1:][same])


def partition_tensors(g: Graph, parts: int) -> Graph:
    """Cut every collective into ``parts`` equal pieces (BytePS tensor partition): with
    several servers or links they proceed in parallel, on one channel they queue."""
    if parts < 1:
        raise DagprofError(f"partition count must be >= 1, got {parts}")
    if parts == 1:
        return g
    colls = find_collectives(g)
    topo, spec = current_topology(g), current_scheme(g)
    b, remap = without_transfers(g, colls)
    for c in colls:
        head = c.head
        for p in range(parts):
            v = b.add_node(f"{g.node_name(c.comm)} part {p}", Kind.COMM, device=int(g.device[c.comm]), order=float(g.order[c.comm]) + p * 1e-6,
                           step=int(g.step[c.comm]), bucket=int(g.bucket[c.comm]), nbytes=int(g.nbytes[c.comm]) // parts, role=int(g.role[c.comm]),
                           comm_kind=int(g.comm_kind[c.comm]))
            b.add_edges([int(remap[h]) for h in head], [v] * len(head))
            b.add_edges([v] * len(c.consumers), [int(remap[u]) for u in c.consumers])
    return retime_collectives(b.build(), topo, spec, lags_on=topo)
