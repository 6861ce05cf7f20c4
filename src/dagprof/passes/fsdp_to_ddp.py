"""FSDP -> DDP: the profiled FSDP2 (or FSDP1) job as DDP would run it (``whatif --data-parallel ddp``, through
``passes.data_parallel.to_data_parallel``, where DDP -> FSDP lies). Every FSDP collective, wait, copy-out and reshard
goes, and with them the untraced spans of FSDP's hooks around them (``_hook_spans``: in the kept part-7 profiles FSDP's forward spent 8-14 ms per step
outside its layers where DDP's spent 1.6-4.5 ms; what stays of it is 1.7-7.6 ms). The root's own backward, which the
FSDP profile holds in the wait on the all-gather the root prefetched, stays (``_root_beside_prefetch``). The gradients
are bucketed by DDP's rule (``bucket_cap_mb``, 25 MiB by default after a first bucket of 1 MiB) in reverse registration
order (the layers' reversed), those of layers that ran no backward left out (frozen: FSDP1 reduce-scatters a flat
parameter whole, frozen originals in it too), each bucket all-reduced once its last layer's backward ran, overlapping the
rest of the backward (the compute it slows there, which the FSDP profile cannot show, raises the interval's high end
unless measured: ``search.whatif``), and DDP's finalize waits for them all (each rank with its median lag on the reduce-scatters' waits: gloo's
reduce-scatter releases the ranks together as DDP's all-reduce does, its all-gather one rank about half a transfer
later, which at 200 Mbit/s put 20 ms per step of lag into the transformer's prediction that DDP did not have) and copies
the buckets back into the gradients before the optimizer, which updates N times the shards. A bucket's enqueue
(standing for DDP's copies of the gradients into it, as FSDP's post-backward copies them into the reduce-scatter's
input) and that copy back each cost the FSDP profile's copy-out time per byte (the same kind of pass over memory).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..costmodel.fsdp_costs import FsdpCosts, optimizer_ratio
from ..costmodel.topology import Topology, priced_kind
from ..errors import DagprofError
from ..graph.build_fsdp import fsdp_collectives, refuse_untimed_roots, step_size
from ..graph.dag import Graph, GraphBuilder
from ..graph.meta import FsdpGraphUnit
from ..traces.events import CommKind, Kind
from ..traces.run_schema import FSDP1_API, FSDP_ROOT
from ..units import MB
from .buckets import chain_lanes, fill_buckets, main_lane
from .comm import current_scheme, current_topology, retime_collectives
from .gradients import unhooked
from .link_fit import find_collectives, graph_world_size

_EPS = 1e-7  # us: an inserted node's order next to the node it precedes or follows (below the profile's 1 ns)
DEFAULT_BUCKET_MB = 25.0
DEFAULT_FIRST_BUCKET_MB = 1.0  # DDP's first bucket where bucket_cap_mb is left unset (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)


def fsdp_to_ddp(g: Graph, bucket_mb: float | None = None, costs: FsdpCosts | None = None) -> Graph:
    """The FSDP2 profile ``g`` as a DDP job with ``bucket_mb`` buckets (None: DDP's defaults, a first bucket of 1 MiB then
    25 MiB ones: the first all-reduce starts once the last layers' gradients are ready, beside the rest of the backward;
    a cap given, DDP uses it for the first bucket too). Its optimizer steps every parameter on every rank:
    with ``costs`` (``dagprof calibrate --fsdp``) the profiled DTensor step on the shards over the measured ratio of the
    two (``FsdpCosts.step_ratio``: DTensor's fixed cost per tensor is no DDP cost), else over ``DTENSOR_STEP``'s ratio for
    the profile's torch version (``optimizer_ratio``), else the profiled step times the ranks.
    With the calibrated file (``whatif --link-model``), FSDP -> DDP on a quiet machine's kept part-7 runs (2 rounds, 2
    models, 3 links) came out -4.4 to +17.0 % (the ranks rule on the same files: -2.2 to +33.2 %; the transformer's 51 small
    tensors gain most, the embedding MLP's 19 lose 1-3 points). Set category by category beside the DDP profile of the
    same job (``bench/bench_fsdp.py --offline DIR --categories``): without FSDP's hook spans, with the root's backward
    that its prefetch's wait held, and the finalize lagging as the reduce-scatters: -0.1 to +11.1 %, each cell high.
    DDP's scaled copy into its buckets and its copy back are priced at their own rates measured by ``calibrate
    --fsdp`` (into storage allocated before), else at FSDP's copy-out into fresh storage, 4-6x dearer per byte on the
    kept runs (+7 ms per step on the transformer, +18 on the MLP, loopback); at their own, the kept runs came out -3.0
    to +7.3 % (they were +11.1 % at most). What stays high: the calibrated DTensor-to-plain ratio put the transformer's
    step 2-5 ms above DDP's, and the transformer's FSDP layers ran their backward 3 ms slower than DDP's."""
    refuse_untimed_roots(g, "--data-parallel ddp")
    fs = g.meta.fsdp
    n = graph_world_size(g)
    fcs = {c.node: c for c in fsdp_collectives(g)}
    colls = {v: c.kind for v, c in fcs.items()}
    found = [c for c in find_collectives(g) if c.comm in colls]
    drop = np.zeros(len(g), dtype=bool)
    # DDP's all-reduce, like gloo's reduce-scatter, releases every rank together; the all-gathers' lag (one rank
    # released about half a transfer after the other) is no DDP cost: the lag of the reduce-scatters' waits
    waits = [v for c in found if colls[c.comm] == CommKind.REDUCE_SCATTER for v in c.consumers if g.kind[v] == Kind.COMM_WAIT and g.rank[v] >= 0]
    lag = _lag_per_rank(g, np.asarray(waits, dtype=np.int64))
    for c in found:
        drop[c.comm] = True
        if c.sync >= 0:
            drop[c.sync] = True
        drop[[v for v in c.consumers if g.kind[v] == Kind.COMM_WAIT and g.rank[v] >= 0]] = True
    size = {u.name: u.numel * _dtype_bytes(u.param_dtype) for u in fs.units}
    copied, copy_us = 0.0, 0.0
    for v in np.flatnonzero((g.rank >= 0) & ((g.kind == Kind.OTHER) | (g.kind == Kind.COMM_ENQUEUE))).tolist():
        name = g.node_name(v).partition(".")[2]
        if name.startswith("fsdp "):  # the collectives' enqueues (``traces.fsdp_run``), copy-outs and reshards
            drop[v] = True
            if name.startswith("fsdp copy-out "):
                copied += size.get(name.removeprefix("fsdp copy-out ").rpartition(" (")[0], 0)
                copy_us += float(g.dur[v])
    us_per_byte = copy_us / copied if copied else 0.0
    in_us_per_byte, out_us_per_byte = (costs.bucket_in_us_per_byte, costs.bucket_out_us_per_byte) \
        if costs is not None and costs.bucket_in_us_per_byte > 0 else (us_per_byte, us_per_byte)
    if all(u.tensors for u in fs.units):  # FSDP ran it: a DDP profile turned FSDP records no tensors, its spans are DDP's own
        drop |= _hook_spans(g, drop)
    channel = int(g.device[found[0].comm]) if found else -1
    if channel < 0:
        raise DagprofError("--data-parallel ddp: the FSDP profile has no collective to take the link from")
    dur = g.dur.copy()
    upd = np.flatnonzero(g.kind == Kind.UPDATE)
    tensors, nbytes = step_size(fs.units)
    # every parameter on every rank, as plain tensors; FSDP1 stepped plain tensors (its flat parameters' shards, or views of
    # them) already: its step times the ranks (DTensor's ratio made fsdp1_sgo_frozen.py's DDP step 0.96 ms where it ran 3.98)
    dur[upd] /= (1.0 / n) if fs.api == FSDP1_API else (optimizer_ratio(costs, g.meta.torch_minor, tensors, nbytes, n) or 1.0 / n)
    cap = DEFAULT_BUCKET_MB if bucket_mb is None else bucket_mb
    trained = _trained_grad_bytes(g, fs.layer_grad_bytes)
    root_of = {x: _root_of(fs.units, x) for x in trained}
    models = sorted({root_of[x] for x, nb in trained.items() if nb > 0}) or [0]
    buckets = {m: _ddp_buckets(g, {x: nb for x, nb in trained.items() if root_of[x] == m}, cap * MB,
                               (DEFAULT_FIRST_BUCKET_MB if bucket_mb is None else cap) * MB) for m in models}
    unit_root = {u.name: u.root for u in fs.units}
    several = len(set(unit_root.values())) > 1  # one root: a bucket none of whose layers ran backward is refused, as before
    layer_root = np.asarray([_root_of(fs.units, x) for x in g.layers] + [-1], dtype=np.int64)  # [-1]: a node of no layer
    b, remap = GraphBuilder.from_graph(g.replace(dur=dur), ~drop)
    _root_beside_prefetch(b, g, [(fcs[c.comm], c) for c in found], {FSDP_ROOT} | {u.name for u in fs.units if u.is_root})
    ranks = sorted(int(r) for r in np.unique(g.rank[g.rank >= 0]))
    for step in g.meta.steps:
        passes = {r: _backward_passes(g, main_lane(g, step, r), step, r) for r in ranks}
        if len({len(p) for p in passes.values()}) > 1:
            raise DagprofError(f"--data-parallel ddp: in step {step} the ranks ran {sorted({len(p) for p in passes.values()})} backward "
                               "passes before an optimizer step; their DDP buckets cannot be matched across ranks")
        last, k = {r: -np.inf for r in ranks}, 0
        for s in range(len(passes[ranks[0]])):
            ran = {int(layer_root[g.layer[v]]) for r in ranks for v in passes[r][s][0] if g.kind[v] == Kind.BACKWARD}
            ran |= {unit_root.get(g.node_name(v).partition(".")[2].removeprefix("fsdp reduce_scatter "), -1) for r in ranks
                    for v in passes[r][s][0] if g.kind[v] == Kind.COMM_ENQUEUE}
            laid = [(m, layers, nbytes) for m in models if m in ran for layers, nbytes in buckets[m]]
            finals = {}
            for r in ranks:
                o, dev = float(g.order[passes[r][s][1]]), int(g.device[passes[r][s][1]])
                finals[r] = b.add_node(f"rank{r}.ddp finalize (wait for buckets)", Kind.COMM_WAIT, rank=r, device=dev, gap=lag.get(r, 0.0),
                                       order=o - 2 * _EPS, step=step)
                b.add_node(f"rank{r}.ddp copy buckets to grads", Kind.OTHER, rank=r, device=dev,
                           dur=sum(nb for _, _, nb in laid) * out_us_per_byte, order=o - _EPS, step=step)
            for m, layers, nbytes in laid:
                sync = b.add_node(f"sync.allreduce bucket {k}", Kind.SYNC, step=step, bucket=k)
                ready = -np.inf
                # a bucket's gradients are ready at the last backward of a layer in it, or of one under a module owning some
                # (a LoRA layer's adapters: the backward of its ``base``); the model's own parameters (or a first layer whose
                # input took no gradient, which times no backward) at the end of its model's backward in this pass, or of the
                # pass where none of its layers timed one (the window's first backward of a GAN's generator, its
                # reduce-scatters recorded but not its layers' backward)
                ids = set().union(*(_layers_under(g, x) for x in layers))
                for r in ranks:
                    bw = [v for v in passes[r][s][0] if g.kind[v] == Kind.BACKWARD]
                    own = [v for v in bw if int(g.layer[v]) in ids]
                    bw = own or ([v for v in bw if layer_root[g.layer[v]] == m] or bw if several or not ids else [])
                    if not bw:
                        raise DagprofError(f"--data-parallel ddp: step {step} on rank {r} runs no backward of {layers[0]}; cannot bucket its gradients")
                    at = max(bw, key=lambda v: g.order[v])
                    o = max(float(g.order[at]), last[r]) + _EPS * (k + 1)
                    last[r] = o
                    enq = b.add_node(f"rank{r}.allreduce bucket {k}", Kind.COMM_ENQUEUE, rank=r, device=int(g.device[at]), dur=nbytes * in_us_per_byte,
                                     order=o, step=step, bucket=k, nbytes=int(nbytes))
                    b.add_edge(int(remap[at]), enq)
                    b.add_edge(enq, sync)
                    ready = max(ready, o)
                comm = b.add_node(f"allreduce bucket {k}.{step}", Kind.COMM, device=channel, order=ready, step=step, bucket=k, nbytes=int(nbytes),
                                  comm_kind=CommKind.ALL_REDUCE)
                b.add_edge(sync, comm)
                for r in ranks:
                    b.add_edge(comm, finals[r])
                k += 1
    chain_lanes(b)
    out = b.build()
    out = out.replace(meta=out.meta.replace(fsdp=None, bucket_cap_mb=cap))
    return retime_collectives(out, _bucket_link(g), current_scheme(g), lags_on=current_topology(g))


def _bucket_link(g: Graph) -> Topology:
    """The link DDP's buckets are priced on: the profile's, less an all-reduce link fitted to the script's own all-reduces
    (FSDP2 runs none; ``link_fit.profiled_kinds`` gives each kind the profile holds its own link): DINO's 2 KB centre
    all-reduce, a sync of the ranks that waited 3.8 ms, priced its 1.2 MB bucket at 39 ms. A calibrated sweep's
    (``Topology.kind_scale``) stays."""
    topo = current_topology(g)
    label = priced_kind(CommKind.ALL_REDUCE).label
    if topo.kind_scale or all(k != label for k, _ in topo.kinds):
        return topo
    return replace(topo, kinds=tuple((k, ab) for k, ab in topo.kinds if k != label))


def _hook_spans(g: Graph, fsdp: np.ndarray) -> np.ndarray:
    """The untraced spans (``other:`` nodes) of FSDP's hooks on each rank's main lane: one that follows a copy-out
    (the pre-forward or pre-backward hook's rest once the unit is gathered) or a reshard (the post-forward hook; after
    backward, the post-backward hook copying the unit's gradients into the reduce-scatter's input, which DDP does as
    its bucket copies: the bucket's enqueue stands for them), or that precedes a forward all-gather's issue (the
    pre-forward hook up to it). A span before a reshard (the unit's own ops after its last layer) stays."""
    out = np.zeros(len(g), dtype=bool)
    for step in g.meta.steps:
        for r in sorted(int(x) for x in np.unique(g.rank[g.rank >= 0])):
            lane = main_lane(g, step, r).tolist()
            names = [g.node_name(v).partition(".")[2] for v in lane]
            for k, name in enumerate(names):
                if name not in ("other:pre-forward", "other:forward", "other:backward"):  # the loss's own span stays
                    continue
                before = names[k - 1] if k and fsdp[lane[k - 1]] else ""
                after = names[k + 1] if k + 1 < len(lane) and fsdp[lane[k + 1]] else ""
                if before.startswith(("fsdp copy-out ", "fsdp reshard ")) or (after.startswith("fsdp all_gather ") and "forward" in name):
                    out[lane[k]] = True
    return out


def _root_beside_prefetch(b: GraphBuilder, g: Graph, colls: list, roots: set[str]) -> None:
    """The root unit's own backward, which FSDP's profile holds in the wait on the all-gather the root prefetched: a hook
    on the model's output opens the root's layers' backward spans before FSDP's pre-backward hook gathers the root, so
    their compute after it runs untraced while the prefetch is in flight and its wait spans it (in the kept part-7
    profiles 5-6 ms of gap on the transformer's, 39-41 ms on the embedding MLP's, about 1 ms on every other
    all-gather's). What that wait measured beyond the rank's median all-gather gap stays as an ``other:backward`` node
    where the wait was (``colls``: (``FsdpCollectiveNode``, ``Collective``) of every FSDP collective; ``roots``: the
    ``fully_shard`` roots' own units, each root's backward so held)."""
    gathers = [c for fc, c in colls if fc.kind == CommKind.ALL_GATHER]
    lag = _lag_per_rank(g, np.asarray([v for c in gathers for v in c.consumers if g.kind[v] == Kind.COMM_WAIT and g.rank[v] >= 0], dtype=np.int64))
    for fc, c in colls:
        if fc.kind != CommKind.ALL_GATHER or fc.prefetched_by not in roots:
            continue
        for v in c.consumers:
            if g.kind[v] == Kind.COMM_WAIT and g.rank[v] >= 0:
                r = int(g.rank[v])
                b.add_node(f"rank{r}.other:backward (the root's, beside its prefetch of {fc.unit})", Kind.OTHER, rank=r, device=int(g.device[v]),
                           dur=max(0.0, float(g.gap[v]) - lag[r]), order=float(g.order[v]), step=int(g.step[v]))


def _backward_passes(g: Graph, lane: np.ndarray, step: int, rank: int) -> list[tuple[list[int], int]]:
    """``lane``'s backward passes, each (its nodes since the pass before, the optimizer step that follows them): DDP's
    reducer all-reduces a model's buckets in every backward that reaches its parameters (its layers' backward, or FSDP's
    reduce-scatters of its units, ran there) and waits for them at that backward's end, before the step (a GAN's
    discriminator twice a step: in its own loss's backward and in the generator's). A backward after the lane's last
    optimizer step joins the pass before it."""
    out: list[tuple[list[int], int]] = []
    pending: list[int] = []
    for v in lane.tolist():
        if g.kind[v] == Kind.UPDATE and any(g.kind[x] == Kind.BACKWARD for x in pending):
            out.append((pending, v))
            pending = []
        elif g.kind[v] != Kind.UPDATE:
            pending.append(v)
    if not out:
        raise DagprofError(f"--data-parallel ddp: step {step} on rank {rank} has no backward followed by an optimizer step to wait for the buckets")
    out[-1][0].extend(v for v in pending if g.kind[v] == Kind.BACKWARD)
    return out


def _root_of(units: list[FsdpGraphUnit], path: str) -> int:
    """The ``fully_shard`` root (``FsdpGraphUnit.root``) a layer or parameter owner ``path`` belongs to: the root of the
    unit running it or a layer under it, else the root whose units' names share its first component (a root model's own
    parameters, ``FSDPViT1.FSDPViT``), else the first. DDP gives each such model its own reducer and buckets."""
    for u in units:
        if any(x == path or x.startswith(path + ".") for x in u.layers):
            return u.root
    head = path.split(".")[0]
    return next((u.root for u in units if u.root > 0 and u.name.split(".")[0] == head), 0)


def _layers_under(g: Graph, owner: str) -> set[int]:
    """Ids of ``g``'s layers at or under the module path ``owner`` (a LoRA layer's adapters: its ``base`` too)."""
    return {k for k, name in enumerate(g.layers) if name == owner or name.startswith(owner + ".")}


def _trained_grad_bytes(g: Graph, grad: dict[str, int]) -> dict[str, int]:
    """``grad`` (an FSDP profile's gradient bytes per owning module) less the owners whose layers ran no backward in any
    step: their parameters took no gradient, so DDP buckets none of them (it leaves out what needs no gradient). FSDP1
    with ``use_orig_params`` reduce-scatters a flat parameter whole, frozen originals in it too, and the profile counts
    them so (fsdp1_sgo_frozen.py's frozen embedding). Owners of no layer (the root model's own parameters) stay."""
    ran = {int(k) for k in np.unique(g.layer[(g.kind == Kind.BACKWARD) & (g.layer >= 0)])}
    return {x: nb for x, nb in grad.items() if not (ids := _layers_under(g, x)) or ids & ran}


def _ddp_buckets(g: Graph, grad: dict[str, int], cap: float, first: float) -> list[tuple[list[str], int]]:
    """DDP's buckets at module granularity: the modules owning gradients in reverse registration order
    (``param_owners``), a bucket closing at the first module that brings it to ``cap`` (the first bucket: to ``first``,
    as ``Reducer``'s size limits are, so that the first all-reduce runs beside the rest of the backward)."""
    owners = reversed(param_owners(g.layers, grad)) if g.layers else []  # no layer timed (a compiled model): none placed
    owners = [x for x in owners if int(grad.get(x, 0)) > 0]
    out = [(owners[start:stop], nb) for start, stop, nb in fill_buckets([int(grad[x]) for x in owners], cap, first)]
    if not out:
        raise DagprofError("--data-parallel ddp: the profile records no gradient bytes per layer; cannot form DDP's buckets" + unhooked(g))
    return out


def _dtype_bytes(dtype: str) -> int:
    return {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}.get(dtype, 4)


def _lag_per_rank(g: Graph, waits: np.ndarray) -> dict[int, float]:
    """Each rank's median wake-up lag after a collective completed (the measured gap of its blocking waits): a rank
    resumes that much after the first rank saw the collective done (``graph.build``), after every blocking collective."""
    waits = np.asarray(waits, dtype=np.int64)
    return {int(r): float(np.median(g.gap[waits[g.rank[waits] == r]])) for r in np.unique(g.rank[waits]).tolist()}


def param_owners(layers: list[str], sizes: dict[str, int]) -> list[str]:
    """The module paths that own parameters (``sizes``' keys: leaf layers, and modules with children that hold their own,
    as a LoRA layer's adapters beside its ``base``), in registration order: a module's own parameters come before its
    children's, so each owner goes just before its first leaf layer; owners without one (the root model's own, by its
    class name) first."""
    leaves = set(layers)
    leafless = [p for p in sizes if p not in leaves and not any(x.startswith(p + ".") for x in layers)]
    out, seen = list(leafless), set(leafless)
    for layer in layers:
        parts = layer.split(".")
        for k in range(1, len(parts) + 1):
            path = ".".join(parts[:k])
            if path in sizes and path not in seen:
                seen.add(path)
                out.append(path)
    return out
