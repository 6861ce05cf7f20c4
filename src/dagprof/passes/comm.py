"""Communication what-ifs on the coarse graph: link bandwidth/latency, collective scheme.

The builder gives one COMM node per collective instance (rank -1, on a COMM device,
``dur`` = measured transfer). The first pass that changes communication fits a
``Topology`` to those measured (nbytes, dur) pairs (``passes.link_fit``), stores it in
``graph.meta.topology`` with the scheme in ``meta.scheme``, and from then on every
COMM node costs ``allreduce_us(nbytes, topology, scheme)`` (an FSDP all-gather or reduce-scatter: the
all-reduce of the same cost, ``graph.build_fsdp.allreduce_equivalent_bytes``): one consistent model for
old and new collectives. Where the topology has a link for a collective's kind (``Topology.kinds``: the profile's own
fit's, or ``dagprof calibrate``'s), a collective of that kind is priced on that link instead, in a graph whose
collectives cost per kind (``kinds_apart``: FSDP's, and any whose own fit set its kinds apart) (and, from a version-3 file,
scaled to what its kind measured at the nearest swept sizes: ``Topology.kind_factor``). Another link measured against the
profiled one (``set_link_ratio``: two calibrations' ratio per kind and size, ``Topology.link_ratio``) scales each
collective's transfer and exit lag by that ratio. The group channel's capacity becomes 1: concurrent
collectives share the link, so the last finishes as late as if they ran in series.

A collective completes on the ranks one after another: gloo's send completes once its bytes sit in the socket
buffer, so the first rank out is released while its peer still receives up to a buffer's worth over the link
(the builder times the shared node to that first completion, and the later ranks keep their lag as their
consumers' overhead). That exit lag is wire time: on the testbed an FSDP all-gather released its second rank
1.8-2.2 ms later at 1 Gbit/s and 8.1-8.2 ms at 200 Mbit/s, about 200 KB either way. So a change of the link's
time per byte scales each rank's lag behind the first rank out by the same ratio (``exit_lags``).

In the averaged model (``passes.average_steps``) a rank's consumer gap is its mean over the steps. Where the last rank
out changes from step to step, the ranks' means come out alike, so no rank lags the others there: the last rank's lag L
is kept as a share on every rank plus the averaged join's added wait for the last arrival, L in all at the next join.
At a link ratio times slower each step's last rank lags ratio x L, so such a collective carries L itself
(``Graph.exit_lag``: its wire time, averaged over the steps) and a link change adds (ratio - 1) x L to every rank's
consumers of it, in place of the per-rank lags: the next join then waits ratio x L, whichever rank comes last. Each
consumer carries the wire time in its own gap (its share of the lag as measured, plus what link changes added), so on a
faster link a rank's gap shrinks by no more than that and the first rank's own wake-up stays; a link changed and changed
back gives the gaps it started from, and core sharing (``passes.compute.share_cores``) takes that wire off the cores.
On the testbed (2 ranks, profiled at 1 Gbit/s) 200 Mbit/s came out -10.4 % with the averaged graph's per-rank lags,
-3.0 % so (``tests/test_exit_lag.py``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from ..costmodel.alphabeta import AlphaBeta
from ..costmodel.collectives import allreduce_us, latency_saved_us
from ..costmodel.topology import CollectiveSpec, Scheme, Topology, per_rank_equivalent_bytes, priced_kind
from ..errors import DagprofError
from ..graph.build_fsdp import is_fsdp_graph
from ..graph.build_ps import DONE, ISSUE, PULL_ISSUE, PULLED, is_ps_graph, rebuild_ps
from ..graph.collectives import add_allreduce
from ..graph.dag import Device, DeviceKind, Graph, GraphBuilder
from ..graph.meta import PsLinkFit
from ..graph.replay_result import ReplayResult
from ..traces.events import CommKind, CommRole, Kind
from ..traces.meta import RowPull
from ..traces.parallelism import Dim
from .link_fit import (
    Collective,
    LinkFit,
    find_collectives,
    fit_topology,
    fitted_stalls,
    floored_kinds,
    graph_world_size,
    hybrid,
    jax_on_gloo,
    keep_stalls,
    link_fit,
    medium_equivalent_bytes,
    pipelined,
    priced_comm,
    priced_world_size,
    profiled_collectives,
    torch_ddp,
    wire_floor,
)


def without_transfers(g: Graph, colls: list[Collective]) -> tuple[GraphBuilder, np.ndarray]:
    """A builder holding ``g`` less the transfer nodes of ``colls``, and where each kept node went (``GraphBuilder.from_graph``):
    what a pass starts from that puts other transfers in their place."""
    drop = np.zeros(len(g), dtype=bool)
    drop[[c.comm for c in colls]] = True
    return GraphBuilder.from_graph(g, ~drop)


# The most bytes a peer may still receive when the first rank out leaves a collective (its send done once its bytes
# sit in the socket): on the namespace testbed an FSDP all-gather's second rank left 1.4-2.2 ms after the first at
# 1 Gbit/s (175-275 kB) and 7.6-9.9 ms at 200 Mbit/s (190-248 kB), whatever the transfer's size. More of a lag than
# that on the profiled link is no wire time to scale: on loopback (a 10 Gbit/s fit on 2 shared cores) DDP's ranks
# lagged 1.3 ms, a descheduled rank, and scaled 50x to 200 Mbit/s added a whole transfer beside the transfer.
SOCKET_BUFFER_BYTES = 256 << 10


def current_topology(g: Graph) -> Topology:
    return g.meta.topology or _fitted_topology(g)


def _fitted_topology(g: Graph, fit: LinkFit | None = None) -> Topology:
    """The topology of the link fitted to ``g``'s collectives as measured (``fit_topology``); a script's own queued
    async collectives' on the wire beside their per-call cost (``own_call_link``)."""
    fit = fit or link_fit(g)
    cost = own_call_cost(g)
    return fit_topology(g, fit) if cost is None else own_call_link(g, fit_topology(g, fit), cost)


def own_call_cost(g: Graph) -> float | None:
    """us: the fixed cost of one of the script's own queued async collectives (``queued_own``) on gloo's worker threads,
    its smallest size's median service time (the channel's time from the later of its ranks' issue and the previous
    completion: what it took beyond its queueing behind the group's earlier works); None where none is queued."""
    if not queued_own(g)[priced_comm(g)].any():
        return None
    try:
        nbytes, dur = profiled_collectives(g, overlapping=True)
    except DagprofError:  # none sized and timed: the link fit refuses as before
        return None
    return float(np.median(dur[nbytes == nbytes.min()]))


def own_call_link(g: Graph, t: Topology, cost_us: float) -> Topology:
    """``t`` with its link the wire alone and ``cost_us`` (``own_call_cost``) a floor each collective takes at least: the
    call's turns on the cores run beside its bytes' crossing, so a wire faster than the call hides nothing and a slower
    one shows only where its time exceeds the call's (``_prices``' floor). The wire: the rate the run was profiled at
    where known (``GraphMeta.wire_bytes_per_s``), else the largest size's median service time beyond the per-call cost
    over its bytes (the rest of the mean is cores: a 1-8 ms stall of a thread waiting for one); what each instance took
    beyond its price stays its own (``instance_residuals``).

    Fitted through the whole service times, the per-call cost read as wire: the DP x TP ViT's 80 all-reduces a step of
    40 B-128 kB on 2 ranks (``bench/tp_fresh/vit_tp_manual_dp.py``, testbed) took 0.15-0.42 ms (medians per size) on
    loopback whatever their bytes, a 190-470 Mbit/s link that ``--bandwidth 1Gbit`` made 2-5 times faster (the job
    measured slower). The hand-bucketed ResNet on 4 ranks over 2 cores (``bench/hand_dp/convnet_buckets.py``) took 3-8
    ms a call on every link, its time beyond that per byte 310-710 Mbit/s at the 200 Mbit/s wire: its wire crossed
    while the ranks' threads waited for a core, and its step did not move from 1 Gbit/s to 200 Mbit/s (114-120 ms)."""
    if g.meta.wire_bytes_per_s is not None:
        beta = 1e6 / g.meta.wire_bytes_per_s
    else:
        nbytes, dur = profiled_collectives(g, overlapping=True)
        n = max(priced_world_size(g), 2)
        beta = max(float(np.median(dur[nbytes == nbytes.max()])) - cost_us, 0.0) / (2 * (n - 1) / n * float(nbytes.max()))
    wire, bare = AlphaBeta(0.0, beta), AlphaBeta(0.0, 0.0)
    none = replace(t, inter=bare, intra=bare, overhead_us=0.0, kinds=(), floor=None, floor_wire=None)
    return replace(t, inter=wire, intra=wire, overhead_us=0.0, kinds=(), floor=replace(none, overhead_us=cost_us), floor_wire=none)


def current_scheme(g: Graph) -> CollectiveSpec:
    return g.meta.scheme or CollectiveSpec()


def retime_collectives(g: Graph, topo: Topology | None = None, spec: CollectiveSpec | None = None,
                       lags_on: Topology | None = None, own_us: np.ndarray | None = None) -> Graph:
    """Every COMM node priced by the model, and the exit lags at its consumers scaled with the link's time per byte
    (a collective's carried ``exit_lag`` on every rank, else each rank's own; module docstring); the topology's world
    size must be the graph's. ``lags_on``: the link the exit lags were measured on (default: the graph's own); a pass
    that rebuilt the collectives passes its input's, since a fit to collectives it has just inserted would be no link at all,
    and ``own_us`` (per node of ``g``), the time each rebuilt collective keeps beside its price (``carried_own_time`` of
    the collective it was rebuilt from; default none)."""
    fit, fitted = _measured_link(g) if lags_on is None else (None, None)  # fitted once for every pass below
    if topo is None:
        topo = fitted or current_topology(g)
        measured_on = lags_on or topo
    else:
        measured_on = lags_on or fitted or _lags_measured_on(g)
    spec = spec or current_scheme(g)
    if is_ps_graph(g):  # a measured parameter-server job: re-place its keys, re-price its messages
        if spec.scheme is not Scheme.PS:
            raise DagprofError(f"this profile is a parameter-server job; scheme {spec} (all-reduce) is not modelled for it, use ps:K")
        return rebuild_ps(g, spec.servers, topo.inter)
    if topo.world_size != priced_world_size(g):
        raise DagprofError(f"topology has {topo.world_size} ranks, the graph's collectives {priced_world_size(g)}")
    idx = np.flatnonzero(priced_comm(g))
    own_time = instance_residuals(g, idx, fit) if lags_on is None else (np.zeros(len(idx)) if own_us is None else own_us[idx])
    if lags_on is None and measured_on is not None:
        own_time = _two_phase_head_starts(g, idx, own_time, measured_on, topo)
    if lags_on is None and not pipelined(g):  # the collectives as measured: their stalls stay where they were (``keep_stalls``)
        g = keep_stalls(g, fit)
    dur, gap = g.dur.copy(), g.gap.copy()
    apart = kinds_apart(g, measured_on)
    kinds = _kind_labels(g, idx, apart)
    equiv = medium_equivalent_bytes(g, idx, topo.half_duplex)  # one medium for every rank: each kind at its bytes' share of it
    consumers, lag = exit_lags(g, idx)
    exit_lag = g.exit_lag.copy()
    if topo.world_size < 2:  # a collective of one rank releases no rank after another
        exit_lag[idx] = 0.0
    last = exit_lag[consumers[:, 0]]  # an averaged collective whose last rank out alternated: its last rank's lag
    own = last == 0
    wire = last.copy()
    wire[own] = wire_lags(g, consumers[own, 0], lag[own])
    wire[lags_not_wire(g, consumers[:, 0])] = 0.0
    waits, after = _peer_waits(g)
    joins, left = _chained_joins(g, idx)
    wired = ~lags_not_wire(g, left)
    joins, left = joins[wired], left[wired]
    before = measured_on if (wire > 0).any() or len(waits) or len(joins) else None
    per_all, moved_all = np.ones(len(g)), np.zeros(len(g))
    chunk = _gathers_last_chunk(g, idx, measured_on, topo) if before is not None else np.zeros(len(g))
    for kind in np.unique(kinds).tolist():  # a kind measured on its own (``Topology.kinds``) on its own link
        sel = kinds == kind
        sizes, inverse = np.unique(equiv[sel], return_inverse=True)
        on = topo.for_kind(kind)
        other = np.array([topo.ratio_at(kind, float(m)) for m in sizes])  # another link measured against this one (``link_ratio``)
        if before is not None:  # the exit lags are wire time: they scale with the kind's time per byte, and with its measured ratio
            old_beta, new_beta = _beta(before.for_kind(kind)), _beta(on)
            was = np.array([before.ratio_at(kind, float(m)) for m in sizes])
            per = np.zeros(len(g))
            per[idx[sel]] = ((new_beta / old_beta if old_beta > 0 else 1.0) * other / was)[inverse.reshape(-1)]
            mine = np.isin(consumers[:, 0], idx[sel])
            ratio = per[consumers[mine, 0]]
            # a rank leaves at most the collective's transfer after the first (every byte still in flight), and at most a
            # socket buffer's worth of bytes on the profiled link (``SOCKET_BUFFER_BYTES``): a longer lag there was a
            # descheduled rank, not wire time to scale (loopback under load), and stays as measured
            moved = np.zeros(len(g))
            moved[idx[sel]] = np.array([min(max(allreduce_us(float(m), before.for_kind(kind), spec) - before.for_kind(kind).overhead_us, 0.0),
                                            SOCKET_BUFFER_BYTES * old_beta) for m in sizes])[inverse.reshape(-1)]
            late = np.where(wire[mine] > 0, np.maximum(wire[mine], chunk[consumers[mine, 0]]), wire[mine])  # a gather's last chunk
            grow = np.minimum(late, moved[consumers[mine, 0]]) * (ratio - 1.0)  # a carried lag shrinks on a rank by no more than the wire in its gap
            grow = np.where(own[mine], grow, np.maximum(grow, -exit_lag[consumers[mine, 1]]))
            np.add.at(gap, consumers[mine, 1], grow)
            carried_lag = np.where(exit_lag[idx[sel]] > 0, np.maximum(exit_lag[idx[sel]], chunk[idx[sel]]), 0.0)
            exit_lag[idx[sel]] += np.minimum(carried_lag, moved[idx[sel]]) * (per[idx[sel]] - 1.0) * ~lags_not_wire(g, idx[sel])
            per_all[idx[sel]], moved_all[idx[sel]] = per[idx[sel]], moved[idx[sel]]
            carried = mine & ~own
            np.add.at(exit_lag, consumers[carried, 1], grow[carried[mine]])  # the wire in its gap now
    if len(waits) and before is not None:  # a Horovod negotiation's wait for a peer still receiving the previous response
        grow = np.minimum(g.exit_lag[waits], moved_all[after]) * (per_all[after] - 1.0)
        grow = np.maximum(grow, -g.exit_lag[waits])
        dur[waits] += grow
        exit_lag[waits] += grow
    if len(joins) and before is not None:  # a rank's late join of a collective straight after another: its exit from that one
        grow = np.minimum(wire_lags(g, left, g.gap[joins]), moved_all[left]) * (per_all[left] - 1.0)
        gap[joins] += np.maximum(grow, -g.gap[joins])
    dur[idx] = np.maximum(model_prices(g, idx, topo, spec, kinds, equiv) + own_time, 0.0)  # each instance's own time beside its price
    if pipelined(g) and lags_on is None:
        dur[idx] += _horovod_stalls(g, idx, dur[idx], kinds, equiv, spec, topo)
    at, priced = in_op_prices(g, topo, spec)
    if len(at):  # the model's own collectives: their price on the graph's link replaced by the new one
        # the link they were priced on (``measured_on``: a pass that rebuilt the collectives gives it), on the medium ``topo``
        # names: a what-if changes the link's rate, not whether its directions share it
        was = (replace(measured_on, half_duplex=topo.half_duplex) if measured_on is not None and measured_on.world_size == topo.world_size
               else topo)
        dur[at] = np.maximum(g.dur[at] + priced - in_op_prices(g, was, spec)[1], 0.0)
    devices = [Device(d.name, d.kind, d.rank, 1) if d.kind == DeviceKind.COMM else d for d in g.devices]
    return g.replace(dur=dur, gap=np.maximum(gap, 0.0), exit_lag=exit_lag, devices=devices, meta=g.meta.replace(topology=topo, scheme=spec, kinds_apart=apart))


def _two_phase_head_starts(g: Graph, idx: np.ndarray, own: np.ndarray, was: Topology, now: Topology) -> np.ndarray:
    """``own`` (the priced collectives ``idx``'s time beside their price: ``instance_residuals``) with the head start of
    each all-reduce of an FSDP job profiled on a known wire (``wire_floor``; gloo's reduce-scatter on CPU is one: two phases
    a port, the second after the peer's first) scaled by a slower link's rate over the profiled one (its kind's time per
    byte, ``was`` against ``now``): gone at a fifth of the rate, as measured, and whole at the profiled rate. An
    all-gather (one phase, sent as its rank joins) keeps its head start as time (``wire_floor``); a faster link keeps
    every one as measured. Only a kind the wire floored has a head start beside its price.

    Not tbf's bucket kept as time (1 ms of the rate, the same time at every rate): on the testbed as hosts
    (``bench/tbf_gap_headstart.py``, 2 gloo ranks, a busy spell of 0.3-4 ms before each call, 2026-12-07) all-reduces of
    2 x 100 kB beat the framed wire by 0.2-0.6 ms at 1 Gbit/s and by at most 0.03 ms at 200 Mbit/s at every spell, and
    the HSDP transformer's (``bench/fsdp_fresh/hsdp_transformer.py``) 1 Gbit/s reduce-scatters, 0.6-1.2 ms under the
    wire each, ran at it at 200 Mbit/s, where their head starts had been carried as time (issue 16)."""
    if not is_fsdp_graph(g) or wire_floor(g) is None or not (own < 0).any():
        return own
    kinds = _kind_labels(g, idx, True)
    out = own.copy()
    for kind in {priced_kind(CommKind.REDUCE_SCATTER).label, priced_kind(CommKind.ALL_REDUCE).label}:
        old, new = _beta(was.for_kind(kind)), _beta(now.for_kind(kind))
        if new > old > 0:
            on = (kinds == kind) & (own < 0)
            out[on] *= old / new
    return out


def _gathers_last_chunk(g: Graph, idx: np.ndarray, was: Topology | None, now: Topology) -> np.ndarray:
    """us per node: the least exit lag, on the profiled link ``was``, of a later rank out of each FSDP all-gather of the
    priced collectives ``idx`` on gloo profiled on a known wire (``wire_floor``), where ``now`` is slower: its last chunk's
    wire time (0 elsewhere). gloo's all-gather sends a rank's shard in two chunks, each only once the peer's recv-ready
    came, and a rank's recv-ready follows its own chunk on the connection: the peer's last chunk leaves after the rank's
    last chunk crossed, and the rank that joined last leaves that chunk's time after the first. On the testbed's shaped
    port a burst after an idle spell (1 ms of the rate: 125 kB at 1 Gbit/s) carries a 50 kB chunk at once, so the HSDP
    transformer's (``bench/fsdp_fresh/hsdp_transformer.py --shard 2``) block all-gathers released their later rank 0.07-0.16
    ms after the first at 1 Gbit/s, and 0.98-3.19 ms (median per gather, 2026-12-07) at 200 Mbit/s, where the 25 kB
    burst carries half of it; scaled by the rate ratio their what-if laid out 0.18-1.87 (issue 16). The chunk's own time
    grows with the rate whatever the burst hid, and the burst (a testbed's bucket) is not taken off: 1.64-2.94 laid out.
    The fsdp_train all-gathers' 200 kB chunks, past the burst at 1 Gbit/s, lagged 1.8-2.2 and 8.1-8.2 ms alike."""
    out = np.zeros(len(g))
    if was is None or not is_fsdp_graph(g) or wire_floor(g) is None or (g.meta.backend or "gloo") != "gloo":
        return out
    gathers = idx[g.comm_kind[idx] == CommKind.ALL_GATHER]
    label = priced_kind(CommKind.ALL_GATHER).label
    old = _beta(was.for_kind(label))
    if _beta(now.for_kind(label)) > old:
        out[gathers] = g.nbytes[gathers] / (2 * max(priced_world_size(g), 2)) * old
    return out


def _kind_labels(g: Graph, idx: np.ndarray, apart: bool) -> np.ndarray:
    """Per priced collective ``idx``, the label of the link it costs on (``Topology.for_kind``): its kind's where the
    graph's collectives cost per kind (``apart``: ``kinds_apart``), else "" (the one link)."""
    if apart:
        return np.array([priced_kind(CommKind(k)).label for k in g.comm_kind[idx].tolist()], dtype=object)
    return np.full(len(idx), "", dtype=object)


def model_prices(g: Graph, idx: np.ndarray, topo: Topology, spec: CollectiveSpec, kinds: np.ndarray | None = None,
                 equiv: np.ndarray | None = None) -> np.ndarray:
    """us: the link model's price on ``topo`` of each priced collective ``idx`` (``kinds``: ``_kind_labels``, ``equiv``:
    ``medium_equivalent_bytes``, given where known), less the latencies its kind's schedule saves against the ring
    all-reduce's (an FSDP job's own calls keep those)."""
    kinds = _kind_labels(g, idx, kinds_apart(g, topo)) if kinds is None else kinds
    equiv = medium_equivalent_bytes(g, idx, topo.half_duplex) if equiv is None else equiv
    out = np.zeros(len(idx))
    for kind in np.unique(kinds).tolist():
        sel = kinds == kind
        sizes, inverse = np.unique(equiv[sel], return_inverse=True)
        out[sel] = _prices(topo, kind, sizes, spec)[inverse.reshape(-1)]
    if is_fsdp_graph(g):
        return out
    called = [CommKind(k) for k in g.comm_kind[idx].tolist()]
    backend = g.meta.backend or "gloo"
    saved = {k: latency_saved_us(k, topo, spec, backend) for k in set(called)}
    return np.maximum(out - np.array([saved[k] for k in called]), 0.0)


def instance_residuals(g: Graph, idx: np.ndarray, fit: LinkFit | None = None) -> np.ndarray:
    """Per priced collective ``idx`` of a JAX job on gloo (``jax_on_gloo``), its own time beside its price that no link
    change moves (0 elsewhere): as measured, its time less its stall (``keep_stalls``) less the mean of its kind and size
    (one collective of the program, one a step); priced (``meta.topology``), its time less its price there. A PyTorch DDP
    job's timed one at a time (``torch_ddp``): only one timed at 0 us (its first rank out before the last joined), which no
    fit took (``profiled_comm``), keeps its 0 beside the mean of those timed of its size. An FSDP job's instances of a kind
    the profiled wire floored (``passes.link_fit.wire_floor``) keep theirs likewise.

    ``bench/ddp_fresh/dqn_replay.py`` profiled on loopback at load 13-18 (``tests/data/ddp-fresh/dqn-loaded``): its equal
    576 kB buckets took 4.6-10.5 ms after the last rank joined while each rank's threads but its main one (gloo's) waited
    22-81 ms a step for a core against 0.7-1.1 ms of CPU (``RankFile.other_threads_ns``), and one took 0 us; that one
    priced at the mean of the four timed, the model of the profiled run came out +2.4 % and every what-if was refused; at
    its 0, +0.5 % (the replay's own miss). Every timed DDP instance at its own time too (as JAX's) moved 8 of 16 held-out
    ``--workers 4 --cores 2`` cells further (``bench/fresh_rounds.py``, 2026-12-07), so they keep their mean.

    At the profiled link every instance then costs what it measured, and a step follows its own collectives, not their
    means, while each kind and size keeps its mean price. gloo's 2-rank all-gather ends with its first rank out
    (``passes.link_fit.transfer_spanned``), where the rest crossing lies in the next collective's join, kept per step
    (``_chained_joins``): on the fresh 1 Gbit/s round of ``bench/frameworks/jax_zero_rs.py`` (2026-12-05 21:42) the 1 MB
    all-gathers' nodes took 4.7-7.2 ms, the next join 2.0-4.3, their sum 8.95-9.24; priced at their mean with the joins
    as measured, the model's steps missed by up to +-3 ms and its median step came out +5.6 %. The spread is the same
    time at either rate (that round's 1 MB reduce-scatters 8.3-10.8 ms at 1 Gbit/s, 43.7-46.1 at 200 Mbit/s), so it is
    kept as time, not as a share of the price. ``fit``: ``link_fit(g)`` where the caller has it. A script's own queued
    async collectives (``own_call_cost``) likewise: each keeps its time beyond its price on the wire beside its call
    (``own_call_link``), as measured or priced."""
    out = np.zeros(len(idx))
    own = own_call_cost(g) is not None
    if not len(idx) or not (jax_on_gloo(g) or own or wire_floor(g) is not None or torch_ddp(g)) or pipelined(g):
        return out
    if g.meta.topology is not None or own:
        return g.dur[idx] - model_prices(g, idx, current_topology(g), current_scheme(g))
    try:
        fit = fit or link_fit(g)
        own = g.dur[idx] - fitted_stalls(g, fit)[idx]
    except DagprofError:  # nothing fitted: ``retime_collectives`` prices nothing either
        return out
    if jax_on_gloo(g) or torch_ddp(g):
        _, like = np.unique(np.stack([g.comm_kind[idx].astype(np.int64), g.nbytes[idx].astype(np.int64)], axis=1), axis=0,
                            return_inverse=True)
        like = like.ravel()
        # a DDP instance timed at 0 us (its first rank out before the last joined) is fitted to nothing (``profiled_comm``):
        # its size's mean is that of those timed, and it keeps its 0 us at the profiled link; the timed keep their mean
        timed = np.ones(len(idx)) if jax_on_gloo(g) else (g.dur[idx] > 0).astype(float)
        counts = np.bincount(like, weights=timed)[like]
        out = own - np.where(counts > 0, np.bincount(like, weights=own * timed)[like] / np.maximum(counts, 1), own)
        if not jax_on_gloo(g):
            out[timed > 0] = 0.0
    floored = floored_kinds(g, fit)
    if floored:  # a kind's link the wire floored (``passes.link_fit.wire_floor``): its instances keep all they took beside its price
        topo = fit_topology(g, fit)
        kinds = _kind_labels(g, idx, kinds_apart(g, topo))
        on = np.isin(kinds, floored)
        out[on] = (own - model_prices(g, idx, topo, current_scheme(g), kinds))[on]
    return out


def carried_own_time(g: Graph) -> np.ndarray:
    """Per node of ``g``, us: the time each priced collective keeps beside its price (``instance_residuals``) where a
    known wire floors its kind (``wire_floor``), or of a DDP job already priced (``torch_ddp``: a bucket timed at 0 us
    keeps its 0; 0 elsewhere), for a pass that rebuilds the collectives to give each rebuilt one its source's
    (``retime_collectives``' ``own_us``). Without it a rebuilt collective of a floored kind costs the wire's price alone:
    the HSDP dual encoder's 1 Gbit/s profile (``tests/data/fsdp-fresh/dual-1x2-1gbit``) with ``--profiled-bandwidth 1Gbit``
    predicted ``--workers 2``, its own layout, at 244 ms against its model's 236 (+3.5 %), and ``--workers 4`` (2x2) +3.1 %
    over the same what-if without the wire: the head start its small collectives measured (``passes.link_fit.wire_floor``)
    lost wherever the workers changed."""
    out = np.zeros(len(g))
    if wire_floor(g) is None and not (g.meta.topology is not None and torch_ddp(g)):
        return out
    idx = np.flatnonzero(priced_comm(g))
    out[idx] = instance_residuals(g, idx)
    return out


def in_op_pieces(g: Graph) -> np.ndarray:
    """The graph's pieces that are a collective the model ran inside one of its ops, sized (their ``group_size``)."""
    return np.flatnonzero((g.group_size > 0) & (g.rank >= 0))


def activation_comm(g: Graph) -> np.ndarray:
    """A user's own Kineto trace's shared collectives that moved activations in the data-parallel group, sized
    (``Parallelism.unknown_are_activations``: a CLIP loss's all-gathers and their backward's scatters, labelled unknown).
    Empty where any unknown collective may be something else."""
    par = g.meta.parallel
    if par is None or not par.unknown_are_activations:
        return np.zeros(0, np.int64)
    return np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.dim == Dim.UNKNOWN) & (g.nbytes > 0))


def job_comm(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, their groups' ranks): a user's own Kineto trace's shared collectives of the job's own (``Dim.JOB``: issued
    after the step's optimizer step, a DCP save's object collectives), sized, in a group whose ranks the trace tells."""
    par = g.meta.parallel
    if par is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    nodes = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.dim == Dim.JOB) & (g.nbytes > 0))
    size = {f"group {x.name}": len(x.ranks) for x in par.groups}
    ranks = np.array([size.get(g.devices[int(d)].name, 0) if d >= 0 else 0 for d in g.device[nodes].tolist()], dtype=np.int64)
    return nodes[ranks > 0], ranks[ranks > 0]


def in_op_prices(g: Graph, topo: Topology, spec: CollectiveSpec) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, us): the link model's price on ``topo`` of each collective the model ran inside an op whose group is the
    ranks ``topo`` prices, its bytes per rank as the all-reduce that costs the same (``costmodel.topology.per_rank_equivalent_bytes``;
    where one medium carries every rank's traffic, at its share there, ``Topology.one_way_share``):
    a dagprof run's pieces (``in_op_pieces``) and a user's Kineto trace's shared nodes (``activation_comm``, ``job_comm``). Under gloo
    such a call blocks the thread that issued it, so a link change moves that op's end by the change in its price:
    ``retime_collectives`` takes its price on the graph's link off its time and adds the new one, keeping the rest as
    measured (the wait for the other ranks, which no edge joins in a dagprof run; at the profiled link, the whole time as
    measured). Replacing its time by its price instead put the fit's 1 ms per collective (two 1-2 MB buckets on loopback)
    on each of CLIP's 8 kB all-gathers and scatters that took 0.04 ms, and on the user's trace of it took the ranks' waits
    at its all-gathers off the model of the profiled run (-2.3 %, refused). A group of other ranks (a worker what-if: the
    model's bytes and calls would change with it) keeps its measured time."""
    named = [(int(v), int(g.group_size[v])) for v in in_op_pieces(g).tolist()]
    named += [(int(v), g.meta.parallel.dp_size) for v in activation_comm(g).tolist()]
    own, ranks = job_comm(g)
    named += list(zip(own.tolist(), ranks.tolist()))
    backend = g.meta.backend or "gloo"
    sized = [(v, topo.one_way_share(kind, backend) * per_rank_equivalent_bytes(kind, float(g.nbytes[v]), ranks, backend),
              latency_saved_us(kind, topo, spec, backend))
             for v, ranks in named if ranks == topo.world_size and g.nbytes[v] > 0 for kind in [CommKind(int(g.comm_kind[v]))]]
    if not sized:
        return np.zeros(0, np.int64), np.zeros(0)
    at, equiv, saved = (np.array(x) for x in zip(*sized))
    return at.astype(np.int64), np.maximum(_prices(topo, "", equiv.astype(float), spec) - saved, 0.0)


def _peer_waits(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Rank 0's Horovod negotiations whose span holds a peer's exit from the previous response (their ``exit_lag``:
    ``graph.build``), and that response's transfer. The peer's lag is wire time as a consumer's is (``exit_lags``): rank 0
    left, its last bytes still in the socket, and the next cycle's coordination waits for the peer to receive them."""
    cand = np.flatnonzero((g.exit_lag > 0) & (g.kind == Kind.OTHER) & (g.rank >= 0) & (g.role == CommRole.NEGOTIATION))
    waits, after = [], []
    for v in cand.tolist():
        prev = [w for u in g.predecessors(v).tolist() if g.device[u] == g.device[v]
                for w in g.predecessors(u).tolist() if g.kind[w] == Kind.COMM and g.rank[w] < 0]
        if prev:
            waits.append(v)
            after.append(prev[0])
    return np.asarray(waits, np.int64), np.asarray(after, np.int64)


def _chained_joins(g: Graph, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The collectives among ``idx`` that a rank joined straight after another's transfer (its join edge, ``graph
    .shared_collectives``), and that transfer. The builder measures the join from the other's first completion, so the
    collective's gap holds the late rank's exit from it: wire time as a consumer's lag is (``exit_lags``), its last bytes
    still crossing. On one medium gloo's 2-rank all-gather ends on one rank while the other's half still crosses
    (``bench/frameworks/jax_zero_rs.py`` on the shaped loopback: the next all-gather's join gap 1.5 ms at 1 Gbit/s, 7.2 ms
    at 200 Mbit/s), and as a fixed gap a slower link left it at 1.5."""
    priced = np.zeros(len(g), dtype=bool)
    priced[idx] = True
    joins, left = [], []
    for c in find_collectives(g):
        prev = [u for u in c.ready if priced[u]] if c.sync >= 0 and priced[c.comm] else []
        if prev:
            joins.append(c.comm)
            left.append(prev[0])
    return np.asarray(joins, np.int64), np.asarray(left, np.int64)


def _prices(topo: Topology, kind: str, sizes: np.ndarray, spec: CollectiveSpec) -> np.ndarray:
    """us for a collective of ``kind`` of each all-reduce-equivalent size in ``sizes`` on ``topo``."""
    on = topo.for_kind(kind)
    if topo.link_delta:  # the calibrated difference added to the profiled price, not its ratio (``Topology.link_delta``)
        priced = np.array([_scaled(allreduce_us(float(m), on, spec), on.overhead_us, topo.kind_factor(kind, float(m)))
                           + topo.delta_at(kind, float(m), topo.world_size) for m in sizes])
    else:  # another link measured against this one (``link_ratio``) scales it
        priced = np.array([_scaled(allreduce_us(float(m), on, spec), on.overhead_us, topo.kind_factor(kind, float(m)) * topo.ratio_at(kind, float(m)))
                           for m in sizes])
    if topo.floor is not None:  # the profiled fit's price, less the wire's part a faster wire saves, as the least (``split_at_wire``)
        fit, was = (np.array([allreduce_us(float(m), t.for_kind(kind), spec) for m in sizes]) for t in (topo.floor, topo.floor_wire))
        priced = np.maximum(priced, fit - was + np.minimum(priced, was))
    return priced


def _horovod_stalls(g: Graph, idx: np.ndarray, priced: np.ndarray, kinds: np.ndarray, equiv: np.ndarray, spec: CollectiveSpec,
                    topo: Topology | None = None) -> np.ndarray:
    """Per Horovod transfer ``idx`` (priced at ``priced`` on the new link ``topo``), what to add to that price for what the
    transfer took beyond the link the graph is on now, which a slower wire hides as far as it takes longer.

    Where ``topo`` has the profiled wire split off (``link_fit.split_at_wire``: its fit a floor), each transfer's own time
    is its floor in place of the fit's: on a slower wire it takes the longer of the wire's time (with the per-byte work
    kept beside it) and its own time, on a faster one its own time less the wire's time saved, never under the new
    wire's; one that beat the profiled wire (bytes through a shaper's bucket) beats the new one as much. The fit's line moved time
    between steps (a transfer under it priced up, one over it down): on fresh two-host rounds (2026-12-05, load 2-5) the
    model's median step came out -7.5 and +1.9 % off hvd_autoencoder's profiles (their mean steps within 0.2 %), now 0.0;
    the 200 Mbit/s what-ifs moved by 0.0-0.6 %, the slower wire's time outweighing either. Elsewhere: the stalls the link
    fit set apart (``LinkFit.stalls``; on a graph already priced, what its transfers took beyond their price), each kept on
    its own transfer. Spread over every collective as latency (the fit's floor), hvd_autoencoder's 7 stalls of 7-166 ms
    among 36 transfers a window (500 Mbit/s, 2026-12-04) put 6.7-7.0 ms on each: its 3-70 kB responses, measured 0.2-6 ms,
    were priced 7.6-10.7 ms, and the model's median step came out +8.4 and +4.6 % over the profile's, its mean -0.1 and
    -0.0 %. Kept beside a slower wire instead, they added 230-247 ms a window at 200 Mbit/s, where that job's own stalls came
    to 74-123 ms; hidden as far as the wire takes longer, 60-99 ms remain (a 2.2 MB transfer's 166 ms stall behind its 114
    ms more of wire: 52 ms)."""
    if not len(idx):
        return np.zeros(0)
    cur = current_topology(g)

    def on(t: Topology) -> np.ndarray:
        out = np.zeros(len(idx))
        for kind in np.unique(kinds).tolist():
            sel = kinds == kind
            sizes, inverse = np.unique(equiv[sel], return_inverse=True)
            out[sel] = _prices(t, kind, sizes, spec)[inverse.reshape(-1)]
        return out

    now = on(cur)
    if topo is not None and topo.floor is not None:
        bare, bare_now = (on(replace(t, floor=None, floor_wire=None)) for t in (topo, cur))
        # the new wire's time, or as much less as the transfer beat the old one's
        least = np.minimum(bare, bare * np.divide(g.dur[idx], bare_now, out=np.ones(len(idx)), where=bare_now > 0))
        return np.maximum(least, g.dur[idx] + np.minimum(priced - now, 0.0)) - priced
    stall = np.maximum(g.dur[idx] - now, 0.0) if g.meta.topology is not None else fitted_stalls(g)[idx]
    return np.maximum(stall - np.maximum(priced - now, 0.0), 0.0)


def _scaled(us: float, overhead_us: float, factor: float) -> float:
    """A collective's price with its transfer (not its fixed overhead) scaled by ``factor`` (``Topology.kind_factor``)."""
    return us if factor == 1.0 or us <= overhead_us else overhead_us + (us - overhead_us) * factor


def lags_not_wire(g: Graph, colls: np.ndarray) -> np.ndarray:
    """Per collective of ``colls``, whether its ranks' lags behind its first rank out are no wire time (``exit_lags``), so
    that a link change leaves them as measured: a JAX job's on gloo (``jax_on_gloo``) but its all-gathers. Those nodes span
    their transfer (``passes.link_fit.transfer_spanned``): each rank leaves with the bytes crossed, and what one took longer
    is its own wake-up. On the testbed's kept round of ``bench/frameworks/jax_zero_rs.py`` (docs/evidence.md, branch jaxfit; 1 Gbit/s, its
    200 Mbit/s job beside it) the consumers' gaps after the 1 MB reduce-scatters were 0.14 / 0.55 ms (ranks 0 / 1) and at
    200 Mbit/s 0.25 / 0.14, scaled as wire they were priced 0.72 / 2.74, the median step +5.8 % (now +2.2); the 1 MB
    all-gathers' grew, 0.65 / 2.34 -> 4.64 / 8.17 (gloo's all-gather ends on one rank while the other's half still crosses)."""
    if not jax_on_gloo(g):
        return queued_own(g)[colls]
    return g.comm_kind[colls] != CommKind.ALL_GATHER


def queued_own(g: Graph) -> np.ndarray:
    """Per node, whether it is a collective a torch script with no DDP or FSDP model issued itself (its own
    ``async_op=True`` calls) behind which its group's next one was queued: every rank issued that next one before
    it waited for this one. A rank's lag behind the first rank out is then no wire time a slower link stretches: the next
    transfer follows on the link at once (priced with it), and the lag is how the rank's threads got their turns on the
    cores. The DP x TP ViT's 40 per-parameter all-reduces a step, issued at once (``bench/tp_fresh/vit_tp_manual_dp.py``
    on the testbed): its consumers' lags summed 308 ms a step (4 ranks) at 1 Gbit/s and 229 at 200 Mbit/s in one round, 187
    and 246 in the other, not the 5 times a wire's; scaled as wire, a 1 Gbit/s profile put 200 Mbit/s +49 and +44 % over
    the jobs measured, so +18 and +17 %."""
    out = np.zeros(len(g), dtype=bool)
    if g.meta.loop_steps is None or g.meta.buckets or g.meta.framework is not None or is_fsdp_graph(g) or pipelined(g):
        return out  # a dagprof run's with no DDP model only (the collector recorded its calls); a Kineto trace's may be DDP's
    issued: dict[int, list[tuple[dict[int, float], dict[int, float], int]]] = {}  # channel -> (issue, wait per rank, node)
    for c in find_collectives(g):
        if g.bucket[c.comm] >= 0:
            continue
        issue, wait = {}, {}
        for u in c.ready:
            issue[int(g.rank[u])] = max(issue.get(int(g.rank[u]), -np.inf), float(g.order[u]))
        for v in c.consumers:
            wait[int(g.rank[v])] = min(wait.get(int(g.rank[v]), np.inf), float(g.order[v]))
        if issue and wait:
            issued.setdefault(int(g.device[c.comm]), []).append((issue, wait, c.comm))
    for mine in issued.values():
        first = min(mine[0][0])  # a rank's own clock orders its calls (each rank calls a group's in one order)
        mine.sort(key=lambda x: x[0].get(first, np.inf))
        for (_, wait, c), (issue, _, _) in zip(mine, mine[1:]):
            out[c] = wait.keys() == issue.keys() and all(issue[r] < wait[r] for r in wait)
    return out


def exit_lags(g: Graph, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((collective, consumer) pairs, each consumer's exit lag in us) for the COMM nodes ``idx``.

    A rank's lag is how much later than the first rank out it left the collective: the least overhead (gap)
    among its consumers of that collective, less the least of any rank's (the builder measures every
    consumer's overhead from the first completion). The first rank's own wake-up is then the common share."""
    counts = np.diff(g.indptr)[idx]
    comm = np.repeat(idx, counts)
    cons = g.succ[np.repeat(g.indptr[idx] - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))].astype(np.int64)
    ranked = g.rank[cons] >= 0
    comm, cons = comm[ranked], cons[ranked]
    if not len(cons):
        return np.empty((0, 2), np.int64), np.empty(0)
    key = comm * (int(g.rank.max()) + 1) + g.rank[cons]  # (collective, rank)
    keys, at = np.unique(key, return_inverse=True)
    rank_gap = np.full(len(keys), np.inf)
    np.minimum.at(rank_gap, at, g.gap[cons])
    colls, of = np.unique(comm, return_inverse=True)
    first = np.full(len(colls), np.inf)
    np.minimum.at(first, of, rank_gap[at])
    return np.stack([comm, cons], axis=1), rank_gap[at] - first[of]


def wire_lags(g: Graph, comm: np.ndarray, lag: np.ndarray) -> np.ndarray:
    """The wire time in each exit lag: at most the median lag of the collectives of its op and size (a buffer's
    worth of bytes), the rest a descheduled rank's (at 1 Gbit/s on a loaded machine single lags reached 30 ms, their median 1.8).
    An op is a name's first word: an FSDP node's kind; a framework's op name with its instance, each alone (pooling
    TF's all-reduces of one size lost 1-3 points on the quiet testbed's 200 Mbit/s what-ifs)."""
    _, like = np.unique(np.stack([np.unique([g.node_name(int(v)).partition(" ")[0] for v in comm], return_inverse=True)[1].ravel(),
                                  g.nbytes[comm]], axis=1), axis=0, return_inverse=True)
    like = like.ravel()
    typical = np.zeros(int(like.max()) + 1 if len(like) else 0)
    for k in range(len(typical)):
        late = lag[(like == k) & (lag > 0)]
        typical[k] = float(np.median(late)) if len(late) else 0.0
    return np.minimum(lag, typical[like])


def _measured_link(g: Graph) -> tuple[LinkFit | None, Topology | None]:
    """The link fitted to ``g``'s collectives as measured and its topology (``fit_topology``), fitted once for the passes
    that price them (``retime_collectives``); (None, None) where ``g`` is priced already, a parameter-server job's, or has
    nothing to fit (those passes then say so, or need no fit)."""
    if g.meta.topology is not None or is_ps_graph(g):
        return None, None
    try:
        fit = link_fit(g)
        if own_call_cost(g) is not None:  # each instance keeps its time beyond its price (``instance_residuals``), no stall apart
            fit = replace(fit, stalls=None)
        return fit, _fitted_topology(g, fit)
    except DagprofError:
        return None, None


def _lags_measured_on(g: Graph) -> Topology | None:
    """The link the graph's exit lags belong to: the one its collectives are priced on now, else the fit to
    them as measured; None where neither exists (a graph whose collectives a pass has just inserted)."""
    try:
        return current_topology(g)
    except DagprofError:
        return None


def kinds_apart(g: Graph, own: Topology | None) -> bool:
    """Whether ``g``'s collectives cost on their own kind's link (``Topology.kinds``; and ``kind_scale``, ``link_ratio``,
    ``link_delta`` per kind), not as all-reduces on the one link: wherever the graph's own link fit produced per-kind links
    (``passes.link_fit.profiled_kinds``: an FSDP job's all-gathers and reduce-scatters, a JAX job's on gloo whose
    all-gathers the fit set apart). ``own`` is that fit (``retime_collectives``: the link the collectives were measured
    on, which a pass that rebuilt them gives, since a fit to its new collectives, or to one rank's, would tell nothing).
    Decided when the graph is first priced and carried from then (``GraphMeta.kinds_apart``): a topology set since (a
    ``dagprof calibrate`` file's) does not say what the profile's fit found. An FSDP job's always: a calibration measures
    its kinds for it (``--link-model``), which price it where its own fit could not tell them apart."""
    if is_fsdp_graph(g):
        return True
    if g.meta.topology is not None:
        return g.meta.kinds_apart
    return own is not None and bool(own.kinds)


def _beta(t: Topology) -> float:
    return t.inter.beta_us_per_byte if t.hosts > 1 or t.devices_per_host == 1 else t.intra.beta_us_per_byte


def set_link(g: Graph, bandwidth: float | None = None, latency_us: float | None = None, which: str = "inter") -> Graph:
    """What if the ``which`` links ("inter", "intra", "all") had this bandwidth (B/s) / latency?"""
    return retime_collectives(g, current_topology(g).with_link(which, bandwidth, latency_us))


def set_link_ratio(g: Graph, ratio: tuple[tuple[str, tuple[tuple[float, float], ...]], ...],
                   delta: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = (), workers: int = 0) -> Graph:
    """What if the link were the one ``ratio`` measured against the profiled one (``costmodel.topology.LinkModelFile.ratio_to``:
    per kind and size, the target's time over the profiled link's)? Each exit lag scales by it (wire time). Each
    collective's transfer grows by ``delta`` (``LinkModelFile.delta_to`` of the same two files, measured on ``workers``
    ranks: the first rank out's calibrated time on the target less on the profiled link), so what the job's collectives
    cost beyond the calibration's carries over as it was; without ``delta`` it scales by the ratio, its fixed overhead
    staying. On the testbed (2 ranks, 1 Gbit/s -> 200 Mbit/s) the ratio put three rounds' kept profiles +5.6, +3.2 and
    +0.6 % over their measured jobs, the difference +1.2, +1.8 and -2.0 % (the vendored pair -0.1 and +0.4 %)."""
    return retime_collectives(g, replace(current_topology(g), link_ratio=ratio, link_delta=delta, link_delta_workers=workers))


def set_topology(g: Graph, topo: Topology) -> Graph:
    """Replace the cluster model outright (a preset or a file); world sizes must agree."""
    return retime_collectives(g, topo)


def set_scheme(g: Graph, spec: CollectiveSpec) -> Graph:
    """All-reduce <-> parameter server (or tree, hierarchical): same tensors, other algorithm."""
    return retime_collectives(g, current_topology(g), spec)


def expand_collectives(g: Graph) -> Graph:
    """Replace each coarse COMM node by its fine-grained sub-graph (per-message nodes on link
    queues). Needs one node per rank in the graph: expand after replicating ranks, not folding."""
    if hybrid(g):
        raise DagprofError(f"per-message collectives of a hybrid job ({g.meta.parallel.describe()}) are not modelled: "
                           "its tensor/pipeline/expert groups would need their own rings")
    topo, spec = current_topology(g), current_scheme(g)
    colls = find_collectives(g)
    n = graph_world_size(g)
    if n != g.world_size:
        raise DagprofError(f"cannot expand collectives of a folded graph ({g.world_size} of {n} ranks present)")
    b, remap = without_transfers(g, colls)
    for c in colls:
        by_rank: list[list[int]] = [[] for _ in range(n)]
        done: list[int] = [-1] * n
        for r in range(n):
            by_rank[r] = [int(remap[v]) for v in c.head]
        for v in c.consumers:
            r = int(g.rank[v])
            if r < 0 or done[r] >= 0:
                raise DagprofError("a collective must feed exactly one node per rank to be expanded")
            done[r] = int(remap[v])
        if min(done) < 0:
            raise DagprofError("a collective feeds no node on some rank; cannot expand it")
        add_allreduce(b, by_rank, done, float(g.nbytes[c.comm]), topo, spec, order=float(g.order[c.comm]),
                      step=int(g.step[c.comm]), bucket=int(g.bucket[c.comm]), tag=f"allreduce s{g.step[c.comm]} b{g.bucket[c.comm]}")
    out = b.build()
    out.meta.fine = True
    return out


# ------------------------------------------------------------------ the parameter server's link, fitted by replay

def exchange_us(g: Graph, start: np.ndarray) -> dict[tuple[int, int], float]:
    """Per (step, worker): replayed first issue -> exchange done, given replayed ``start`` times."""
    names = np.array(g.names)[g.name]
    first: dict[tuple[int, int], float] = {}
    for v in np.flatnonzero(names == ISSUE):
        key = (int(g.step[v]), int(g.rank[v]))
        first[key] = min(first.get(key, np.inf), float(start[v]))
    return {key: float(start[v]) - first[key] for v in np.flatnonzero(names == DONE) if (key := (int(g.step[v]), int(g.rank[v]))) in first}


def push_spread_us(g: Graph, start: np.ndarray) -> list[float]:
    """Per step, how far apart the workers began their exchanges (their first pushes issued: the latest less the earliest),
    given ``start`` times (``g.order``: as measured; a replay's ``start``). A what-if's copies of a worker begin with it."""
    names = np.array(g.names)[g.name]
    first: dict[int, dict[int, float]] = {}
    for v in np.flatnonzero(names == ISSUE):
        per = first.setdefault(int(g.step[v]), {})
        per[int(g.rank[v])] = min(per.get(int(g.rank[v]), np.inf), float(start[v]))
    return [max(per.values()) - min(per.values()) for _, per in sorted(first.items())]


# a fit this close below the wire's rate is the wire (``ps_bandwidth``): a fresh ``mx_bow_2bit.py``'s fits at a 500 Mbit/s
# tbf scattered over 463-534 Mbit/s in 6 rounds (TCP's payload is at most 96 % of the rate, the tbf's bucket adds bursts);
# the fits that were not the wire came to 37-55 % of it (``mx_resnet_2bit.py``; ``mx_mlp.py`` under load, the
# ``testbed_loaded`` fixture's 277 Mbit/s), so a fit this far below it is a limit of its own (``NOT_WIRE_FIT``) (docs/evidence.md)
WIRE_FIT_SCATTER = 0.9
NOT_WIRE_FIT = 0.6


def ps_bandwidth(fitted: float, wire: float, asked: float, more: float = 1.0) -> float:
    """The bandwidth (B/s) a parameter-server job's messages get at ``asked``, from the ``fitted`` link (``fit_ps_link``)
    of a profile run over a ``wire`` of known rate (all B/s), where a server's port carries ``more`` times the profile's
    bytes an exchange (workers per server against the profile's, ``ps_port_share``). Fitted faster than the wire, the
    excess is the port's burst allowance: bytes a shaper's bucket passes at once after the port idled, the same bytes
    per exchange whatever the rate and however many workers share the port. An exchange of B bytes took B / fitted, of
    which the wire carried wire x B / fitted; at ``asked`` one of ``more`` x B takes (more x B - (B - wire x B / fitted))
    / asked: at the profile's bytes the rate ratio (asked x fitted / wire), with more bytes through the port the burst a
    smaller share of them. mx_attn_accum.py (6 kept testbed rounds, profiled 2 workers at 500 Mbit/s, fitted 668-792
    Mbit/s) at 4 workers into 1 server at 200 Mbit/s: the rate ratio priced the port at 267-317 Mbit/s and its exchanges
    at 14-17 ms against 22-26 measured (``--cores 2``). Fewer bytes per port (``more`` below 1) are priced as the
    profile's: the burst may then carry all of them, which the fit does not tell. Fitted slower, what limited the
    exchanges was not the wire (busy cores moving the bytes, segments lost and resent), and it streams beside the wire
    rather than after it: a slower wire hides it, and the messages move at the slower of the two; a faster one does not
    lift it. On the namespace testbed under load 13-15 (mx_mlp.py, 2 workers, 1 server) fits of 271-273 Mbit/s at a
    500 Mbit/s tbf (170-420 segments retransmitted) fitted 180-187 at 200 Mbit/s (its payload 191), where the rate
    ratio would have priced them at 109. Fitted infinitely fast (no exchange longer than its replay with no wire at all:
    ``fit_ps_link``), the profile saw no wire to scale, and the messages move at ``asked``. Fitted within the scatter of
    a fit of the wire (``WIRE_FIT_SCATTER``) below it, it is the wire, scaled by the rate ratio: ``mx_bow_2bit.py``'s fits
    of 470-498 Mbit/s at a 500 Mbit/s tbf, kept as a limit, put 1 Gbit/s at the profiled step (+64 to +90 %, 3 of 4
    rounds; the fourth, fitted faster, +5 %). Between the two (``NOT_WIRE_FIT`` of the wire and its scatter) neither is
    known, and a step between them would move the answer by the rate ratio for a fit a few Mbit/s away: the time per byte
    is the two's, mixed in proportion to where the fit lies (a fresh ``mx_kws_2bit.py`` profile fitted at 441-459 Mbit/s
    at a 500 Mbit/s tbf as the model of its exchanges changed: 1 Gbit/s -7.8 % as the wire, +25.2 % as a limit)
    (docs/evidence.md)."""
    if np.isinf(fitted):
        return asked
    wired = asked / (1.0 - (1.0 - wire / fitted) / max(more, 1.0))
    limit = min(asked, fitted)
    share = float(np.clip((fitted / wire - NOT_WIRE_FIT) / (WIRE_FIT_SCATTER - NOT_WIRE_FIT), 0.0, 1.0))
    return 1.0 / (share / wired + (1.0 - share) / limit)


def ps_port_share(g: Graph) -> float:
    """Bytes through a server's port per exchange against the profile's: the graph's workers per server over those the
    link was fitted to (1 where the fit did not record them)."""
    fit, ps = g.meta.ps_link_fit, g.meta.ps
    if fit is None or ps is None or not fit.workers_per_server:
        return 1.0
    return ps.num_workers / current_scheme(g).servers / fit.workers_per_server


def fit_ps_link(g: Graph, replayer: Callable[[Graph], ReplayResult], iterations: int = 30) -> Graph:
    """``g`` (from ``build_ps_graph``) with the bandwidth at which its push/pull exchanges replay as measured.

    mx.profiler does not say which push carries which key, so single messages cannot be timed. What
    is measured per worker and step is the exchange: from its first push issued to its last pull in
    (``meta.ps.exchange_us``). The rate is the one at which the replayed exchanges last as
    long as the measured ones, on average (replayed exchanges shorten monotonically with the rate,
    so bisection finds it). Only communication is matched: compute, framework gaps and the ops that
    wait for the pulls replay as measured, so the profiled iteration's replay is a check of the
    model, not a fit. The per-message latency (the shortest push/pull round trip) and the server
    work per byte come from the builder's first guess (``graph.build_ps.initial_link``), its work per key
    from the servers' profiles (``graph.build_ps.update_us``). With row_sparse pulls the rate is fitted
    again once their own times are (``_fit_row_pulls``), and they again at that rate: they move each
    worker's pushes, and a key's update waits for every worker's push (``mx_sparse_mf.py``: the replayed
    exchanges 1 ms short of the measured ones, the profiled run -3.8 %, until the rate was refitted; a
    first fit at an infinite rate left the pulls' own fit against no wire, +23 % until they were refitted).

    ``replayer`` is ``dagprof.replay.replay`` (passes sit below the replay layer).
    """
    link, servers = g.meta.topology.inter, g.meta.scheme.servers
    target = float(np.mean([span for _, _, span in g.meta.ps.exchange_us]))

    def rate(extra: dict, ratio: float) -> AlphaBeta:
        def mean_exchange(beta: float) -> float:
            h = rebuild_ps(g, servers, replace(link, beta_us_per_byte=beta), extra, ratio, {})
            return float(np.mean(list(exchange_us(h, replayer(h).start).values())))

        lo, hi = 0.0, max(link.beta_us_per_byte, 1e-6)
        at_lo, at_hi = mean_exchange(lo), mean_exchange(hi)
        while at_hi < target and hi < 1e3:
            hi *= 4
            at_hi = mean_exchange(hi)
        if at_lo >= target:  # even an infinitely fast link exchanges too slowly
            hi, at_hi = lo, at_lo
        for _ in range(iterations if hi > lo else 0):
            mid = (lo + hi) / 2
            at = mean_exchange(mid)
            lo, at_lo, hi, at_hi = (mid, at, hi, at_hi) if at < target else (lo, at_lo, mid, at)
        # the replayed exchanges jump where an order on a port or a server flips (the 2-server fixture: 38.0 -> 39.2 ms at one
        # rate, 38.3 measured): of the rates either side, the one whose exchanges come closer
        return replace(link, beta_us_per_byte=lo if lo > 0 and abs(at_lo - target) < abs(at_hi - target) else hi)

    fitted = rate({}, 1.0)
    ratio, extra = _fit_row_pulls(g, fitted, replayer)
    if extra:  # the pulls as fitted move the workers' pushes, and a push waits for the other workers' at the server
        fitted = rate(extra, ratio)
        ratio, extra = _fit_row_pulls(g, fitted, replayer)  # and their wire is the refitted link's
    factors = _fit_step_factors(g, servers, fitted, extra, ratio, replayer)
    out = rebuild_ps(g, servers, fitted, extra, ratio, factors)
    hi = fitted.beta_us_per_byte
    out.meta.ps_link_fit = PsLinkFit(float(1e6 / hi) if hi > 0 else float(np.inf), link.alpha_us, link.gamma_us_per_byte, target,
                                     g.meta.ps.num_workers / servers, tuple(RowPull(*key, us) for key, us in sorted(extra.items())), ratio,
                                     tuple(sorted(factors.items())))
    return out


_STEP_FIT_TOLERANCE = 0.005  # a step's replayed exchange this close to its measured one (relative) ends the fit


def _fit_step_factors(g: Graph, servers: int, link: AlphaBeta, extra: dict, ratio: float, replayer: Callable[[Graph], ReplayResult],
                      rounds: int = 16) -> dict[int, float]:
    """Per profiled step, the factor on ``link``'s time per byte at which that step's replayed exchanges last as long as
    its measured ones (the workers' mean), as op times are kept per step.

    One rate for every step makes each exchange the mean one, and a step whose exchange ran long under load is replayed
    short: the backward ops no push waits for, which ran beside it and were slowed with it (``mx_gru_forecast.py`` under
    load: single ops up to 90 ms), then end after it, and a short exchange recovers no lag a long one left where those
    ops set the step, so the lag only accumulates (a fresh profile's replay +4.7 %, 11 ms of lag by its 4th step).
    A few rounds: an exchange also holds the latency, the server's work and the wait for the other workers, which the
    factor does not scale: until every step's replayed exchange is within 0.5 % of its measured one, at most ``rounds``,
    keeping the round that came closest (the exchanges jump where an order on a port flips, so a round can overshoot).
    6 rounds left a fresh ``mx_mlp.py`` profile's steps 1-3 % off and its model +2.3 %, +1.5 % when they came closer.
    {} where the link moves no byte in time (fitted infinitely fast)."""
    if link.beta_us_per_byte <= 0:
        return {}
    spans: dict[int, list[float]] = {}
    for step, _, us in g.meta.ps.exchange_us:
        spans.setdefault(int(step), []).append(us)
    target = {s: float(np.mean(v)) for s, v in spans.items()}
    factors = dict.fromkeys(target, 1.0)
    best, off = factors, np.inf
    for _ in range(rounds):
        h = rebuild_ps(g, servers, link, extra, ratio, factors)
        got: dict[int, list[float]] = {}
        for (step, _), us in exchange_us(h, replayer(h).start).items():
            got.setdefault(step, []).append(us)
        ratios = {s: target[s] / max(float(np.mean(got[s])), 1e-9) for s in factors if s in got}
        worst = max((abs(x - 1.0) for x in ratios.values()), default=0.0)
        if worst < off:
            best, off = factors, worst
        if worst < _STEP_FIT_TOLERANCE:
            break
        factors = {s: float(np.clip(f * ratios[s], 0.05, 20.0)) if s in ratios else f for s, f in factors.items()}
    return best


def _fit_row_pulls(g: Graph, link, replayer: Callable[[Graph], ReplayResult], rounds: int = 3) -> tuple[float, dict[tuple[int, int, int], float]]:
    """The row_sparse pulls' wire against ``link`` and each pull's time beyond it, (``PsLinkFit.row_pull_beta_ratio``,
    (step, worker, key) -> us), so that the replayed pulls (call -> rows in) last as long as the measured ones, as op
    times are kept per step.

    The wire: the link is fitted to the push exchanges, which wait for the slowest worker and the servers' updates, and
    came out slower than the pulls' own wire (mx_fasttext_sparse.py on loopback under load 13: 300 kB pulls in 1.7 ms that
    the fitted link took 4 ms to carry); the fastest pull sets the pulls' time per byte, as the shortest exchange sets the
    latency (``graph.build_ps.initial_link``). Beyond it, each pull keeps its own: ps-lite copies the rows out and in on
    threads mx.profiler does not trace, which wait for busy cores (on 2 cores under load 8, 150-300 kB pulls took 1.7-10.3
    ms), so the time varies from pull to pull with the load, not with the bytes; one mean per byte made pulls the model
    slowed delay the forward pass, and the profiled run replayed +2.9 % off. A few rounds: a pull's rows share the ports."""
    measured = {(p.step, p.worker, p.key): p.us for p in g.meta.ps.row_pull_us}
    if not measured:
        return 1.0, {}

    def spans(ratio: float, extra: dict) -> dict:
        h = rebuild_ps(g, g.meta.scheme.servers, link, extra, ratio)
        res = replayer(h)
        names = np.asarray(h.names)[h.name]
        issued = {(int(h.step[v]), int(h.rank[v]), int(h.bucket[v])): float(res.end[v]) for v in np.flatnonzero(names == PULL_ISSUE)}
        return {key: float(res.start[v]) - issued[key] for v in np.flatnonzero(names == PULLED)
                if (key := (int(h.step[v]), int(h.rank[v]), int(h.bucket[v]))) in issued}

    extra = dict.fromkeys(measured, 0.0)
    fixed = 2 * link.alpha_us  # a pull's latencies, request and rows, which no rate changes
    wire = spans(1.0, extra)
    ratio = min(1.0, max(0.0, min((measured[k] - fixed) / max(us - fixed, 1e-9) for k, us in wire.items() if k in measured)))
    for _ in range(rounds):
        replayed = spans(ratio, extra)
        for key, us in replayed.items():
            if key in measured:
                extra[key] = max(extra[key] + measured[key] - us, 0.0)
    return ratio, extra
