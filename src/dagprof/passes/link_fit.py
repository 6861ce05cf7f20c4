"""The collectives the link model prices, and the link fitted to them as profiled.

``fit_topology`` fits a flat ``Topology`` to the measured (bytes, duration) pairs of the priced collectives (in a hybrid
job the data-parallel ones only, ``priced_comm``): latency and bandwidth together where sizes tell them apart
(``fit_link``, robust to a few stalled instances whose excess stays on them: ``keep_stalls``; on a JAX job, also to those
slower than every instance of a larger size, ``slower_than_larger``), one kind's own link per
FSDP collective kind (``profiled_kinds``; a JAX job's all-gathers on their own, ``gathers_apart``, ``gathers_own_line``),
and split at the wire rate the run was profiled at where known (``split_at_wire``). ``passes.comm`` prices every collective on that topology.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..costmodel.alphabeta import AlphaBeta, fit_alpha_beta
from ..costmodel.gloo_ring import unhidden_reduce_us
from ..costmodel.topology import Topology, one_way_share, priced_kind
from ..errors import DagprofError
from ..graph.build_fsdp import allreduce_equivalent_bytes, is_fsdp_graph
from ..graph.build_ps import is_ps_graph
from ..graph.dag import Graph
from ..traces.events import CommKind, Kind
from ..traces.horovod import tensor_collective
from ..traces.parallelism import Dim


@dataclass
class Collective:
    """One collective instance of the coarse graph."""

    comm: int  # the shared transfer node
    sync: int  # the join of every rank's ready point (-1 when the builder made none)
    ready: list[int]  # predecessors of the join: each rank's enqueue
    consumers: list[int]  # successors of the transfer: each rank's wait/update

    @property
    def head(self) -> list[int]:
        """What the transfer starts after: the join, or each rank's ready point where the builder made none."""
        return [self.sync] if self.sync >= 0 else self.ready


def find_collectives(g: Graph) -> list[Collective]:
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    out = []
    for c in comm.tolist():
        preds = g.predecessors(c).tolist()
        syncs = [p for p in preds if g.kind[p] == Kind.SYNC]
        sync = syncs[0] if syncs else -1
        ready = g.predecessors(sync).tolist() if sync >= 0 else preds
        out.append(Collective(c, sync, ready, g.successors(c).tolist()))
    return out


def graph_world_size(g: Graph) -> int:
    return int(g.meta.world_size or g.world_size)


def one_host(g: Graph) -> str | None:
    """The host every rank of ``g`` ran on, where its profile records one host holding them all (``GraphMeta.host_cpus``);
    else None (several hosts, or none recorded: then whether a transfer is CPU work is not known)."""
    hosts = g.meta.host_cpus
    if len(hosts) != 1:
        return None
    (host, group), = hosts.items()
    return host if group.ranks == graph_world_size(g) else None


def hybrid(g: Graph) -> bool:
    """True when the graph's collectives serve more than data parallelism (tensor, pipeline, expert groups)."""
    return g.meta.parallel is not None and g.meta.parallel.hybrid


def priced_world_size(g: Graph) -> int:
    """Ranks the modelled collectives span: the data-parallel group of a hybrid job, else every rank."""
    return g.meta.parallel.dp_size if hybrid(g) and g.meta.parallel.dp_size else graph_world_size(g)


def priced_comm(g: Graph) -> np.ndarray:
    """The shared COMM nodes the link model prices. In a hybrid job only the data-parallel ones: the others
    (TP, PP, EP/CP, unknown) keep their measured times, since their groups and traffic are not modelled. The job's own
    (``Dim.JOB``: after its step's optimizer step) are no training traffic to fit the link to or to scale with the
    workers: ``passes.comm.in_op_prices`` re-prices them for link what-ifs."""
    mask = (g.kind == Kind.COMM) & (g.rank < 0) & (g.dim != Dim.JOB)
    return mask & (g.dim == Dim.DP) if hybrid(g) else mask


@dataclass(frozen=True)
class LinkFit:
    """The link fitted to a profile's collectives, and whether it can be trusted away from them."""

    link: AlphaBeta  # alpha: per-message latency of a ring step
    collectives: int  # fitted
    sizes: int  # distinct message sizes among them
    r2: float | None  # share of the durations' variance the fit explains; None where nothing separates the terms
    weak: str | None  # why latency and bandwidth are not told apart (None: they are)
    # per fitted collective (``profiled_comm``'s order), its time beyond the link that stays on it as measured (``_fit_robust``)
    stalls: np.ndarray | None = field(default=None, compare=False)
    # an FSDP profile's per-kind links fitted with one overhead where one link fits its kinds poorly (``kinds_fit``): ``Topology.kinds``
    kinds: tuple[tuple[str, AlphaBeta], ...] = ()
    apart: bool = False  # a JAX job's all-gathers set apart, on a link of their own (``gathers_apart``)
    # a JAX job's all-gathers' own line where no other kind shows a slope of its own (``gathers_own_line``); None: their kind's
    # time per byte, as measured, on the one fit's overhead (``profiled_kinds``)
    gathers: AlphaBeta | None = None

    def describe(self) -> str:
        r2 = "" if self.r2 is None else f", R^2 {self.r2:.2f}"
        return f"fitted to {self.collectives} collectives of {self.sizes} size(s){r2}"


def profiled_collectives(g: Graph, overlapping: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(all-reduce-equivalent bytes as the link prices them, ``medium_equivalent_bytes``, transfer us) of every priced
    collective with a measured duration (``profiled_comm``); 0 B ones carry latency alone."""
    comm = profiled_comm(g, overlapping)
    return medium_equivalent_bytes(g, comm, g.meta.half_duplex), g.dur[comm].astype(float)


def medium_equivalent_bytes(g: Graph, idx: np.ndarray, half_duplex: bool) -> np.ndarray:
    """``allreduce_equivalent_bytes`` of the priced collectives ``idx``, where every rank's traffic crosses one medium
    (``half_duplex``) at their bytes' share of it (``costmodel.topology.one_way_share``); an FSDP job's own all-gathers
    keep half their bytes (``allreduce_equivalent_bytes``) and so their whole share. The fit and the pricing take the same:
    JAX's ZeRO by hand (``bench/frameworks/jax_zero_rs.py``) on the testbed's one shaped loopback, its all-gathers fitted
    at gloo's 2-rank 3/4 of their gathered bytes where the medium carried 1/2 beside reduce-scatters at 1/2, put the link
    at 188 % of the wire and a 1 Gbit/s -> 200 Mbit/s what-if 19-22 % short."""
    equiv = allreduce_equivalent_bytes(g, idx)
    if not half_duplex:
        return equiv
    n, backend, fsdp = priced_world_size(g), g.meta.backend or "gloo", is_fsdp_graph(g)
    kinds = [CommKind(k) for k in g.comm_kind[idx].tolist()]
    return equiv * np.array([1.0 if fsdp and k == CommKind.ALL_GATHER else one_way_share(k, n, backend) for k in kinds])


# the Python API records no shapes by default (their cost on small CPU ops): a DP x TP ViT profiled by it was told to use
# `dagprof profile`, which refused it (no DDP/FSDP model)
SIZES_HINT = ("torch.profiler records them only with record_shapes=True; `dagprof profile` always does, the Python API "
              "with `dagprof.profile(DIR, ..., record_shapes=True)`")


def profiled_comm(g: Graph, overlapping: bool = False) -> np.ndarray:
    """The priced collectives with a measured duration, the link is fitted to. ``overlapping`` (collectives that share
    the link on several lanes, whose total alone is known): those measured at 0 us too, since their bytes crossed the
    link within the others' time (a 1.5 MB gloo bucket beside an 8.4 MB one came out 0 us each step, and without its
    bytes the link was fitted 15 % slow)."""
    mask = priced_comm(g)
    comm = np.array([c.comm for c in find_collectives(g) if mask[c.comm]], dtype=np.int64)
    comm = comm[(g.dur[comm] >= 0) if overlapping else (g.dur[comm] > 0)] if len(comm) else comm
    if not len(comm) or not (g.nbytes[comm] > 0).any():
        hint = ""
        if len(comm) and g.meta.framework is None:  # timed, but sizeless: a Kineto trace recorded without shapes
            hint = f" ({len(comm)} collectives timed without their sizes: {SIZES_HINT})"
        if hybrid(g):
            why = "; nothing tells the unknown ones' dimension: no group description, pass or DDP bucket" if Dim.UNKNOWN in g.meta.parallel.dims else ""
            raise DagprofError(f"not modelled: what-ifs re-price data-parallel collectives only, and this trace has none of known size and "
                               f"duration (its collectives: {g.meta.parallel.describe()}{why}){hint}")
        raise DagprofError("the trace has no collective with known size and duration to fit a link model to" + hint, g.meta.source)
    par = g.meta.parallel
    if par is not None and par.ungrouped:
        raise DagprofError(f"not modelled: the trace does not say which process group each collective ran in ({par.ungrouped}), so "
                           "their sizes and the link cannot be told (record pg_config, i.e. torch >= 2.2's distributedInfo; give each "
                           "group a group_desc, or use init_device_mesh with mesh_dim_names)")
    return comm


def link_fit(g: Graph) -> LinkFit:
    """The link fitted to ``g``'s collectives as measured; the stalls it sets apart stay on their own instances
    (``keep_stalls``; Horovod's on their transfers, ``passes.comm._horovod_stalls``)."""
    if (apart := gathers_apart(g)) is not None:  # the all-gathers on a link of their own (``profiled_kinds``)
        return apart
    concurrent = g.meta.comm_lanes > 1
    nbytes, dur = profiled_collectives(g, overlapping=concurrent)
    n = priced_world_size(g)
    wire = None if g.meta.wire_bytes_per_s is None else 1e6 / g.meta.wire_bytes_per_s
    fit = _fit_timed(nbytes, dur, n, concurrent, wire, joined_together(g, profiled_comm(g, concurrent)), monotone=jax_on_gloo(g))
    if fit.weak is not None and not concurrent and (joint := kinds_fit(g)) is not None:
        overhead, total, kinds, r2 = joint
        return replace(fit, link=AlphaBeta(overhead / (2 * (max(n, 2) - 1)), total.beta_us_per_byte), r2=r2, weak=None, stalls=None, kinds=kinds)
    return gathers_own_line(g, fit) or fit


def gathers_own_line(g: Graph, fit: LinkFit) -> LinkFit | None:
    """``fit`` (the one line through every kind of a JAX job on gloo, ``jax_on_gloo``) with its all-gathers set apart on a
    line of their own, fitted to them alone (latency and bandwidth, robust: ``_fit_timed``; their stalls that line's), where
    ``gathers_apart`` set none apart because no other kind shows a slope of its own (``transfer_spanned``) but the
    all-gathers do; None elsewhere (and where their own fit cannot tell latency from bandwidth). Each other kind then
    costs on its own link too (``profiled_kinds``: its time as measured, less the one fit's stalls, per byte; the wire its
    floor, ``wire_floor``).

    The all-gathers' nodes end with their first rank out (``transfer_spanned``): a share of their transfer, which scales
    with the link as the transfer does. Through the one line they were priced as a whole transfer and kept the rest as
    fixed time. ``bench/frameworks/jax_fsdp_conv.py`` on the testbed (500 Mbit/s, one 378 kB all-reduce and one 4 kB
    all-to-all a micro-batch beside 13 all-gathers of 20 B-288 kB): its 288 kB all-gathers took 2.35-2.64 ms in 24 of 32
    instances, 0.56 of the one line's price (the line 103 % of the wire, carried by the all-reduces at 1.0-2.5 times it);
    at 200 Mbit/s they took 6.2-8.2 ms and were priced 10.4-12.8, the what-if's median step +9.3 % over the measured
    168.1 ms. On their own line (0.48 of the wire's time per byte, latency 24 us a ring step) +0.4 %, the model of the
    profiled run +1.9 -> -0.4 %."""
    if not jax_on_gloo(g) or fit.weak is not None or g.meta.comm_lanes > 1:
        return None
    comm = profiled_comm(g)
    gat = g.comm_kind[comm] == CommKind.ALL_GATHER
    nbytes, dur = profiled_collectives(g)
    if gat.all() or not _sizes_apart(nbytes[gat]):  # all-gathers alone: the one line is theirs
        return None
    n = priced_world_size(g)
    wire = None if g.meta.wire_bytes_per_s is None else 1e6 / g.meta.wire_bytes_per_s
    own = _fit_timed(nbytes[gat], dur[gat], n, False, wire, joined_together(g, comm[gat]), monotone=True)
    if own.weak is not None:
        return None
    steps = 2 * (max(n, 2) - 1)  # their latency beside the one fit's overhead, which every kind pays (``fit_topology``)
    link = AlphaBeta(max(own.link.alpha_us - _collective_overhead_us(g, fit) / steps, 0.0), own.link.beta_us_per_byte)
    stalls = np.zeros(len(comm)) if fit.stalls is None else fit.stalls.copy()
    stalls[gat] = 0.0 if own.stalls is None else own.stalls
    return replace(fit, apart=True, gathers=link, stalls=stalls if stalls.any() else None)


def gathers_apart(g: Graph) -> LinkFit | None:
    """The link fitted to a JAX job's collectives on gloo (``jax_on_gloo``) but its all-gathers, where the rest tell it
    (``transfer_spanned``); None elsewhere. The all-gathers then cost on a link of their own (``profiled_kinds``), at the
    share of their medium time their nodes measured. Its stalls are per collective of ``profiled_comm``, 0 on the all-gathers."""
    if not jax_on_gloo(g):
        return None
    concurrent = g.meta.comm_lanes > 1
    try:
        comm = profiled_comm(g, overlapping=concurrent)
    except DagprofError:  # nothing to fit: ``link_fit`` says so
        return None
    spans = transfer_spanned(g, comm)
    if spans.all():
        return None
    nbytes, dur = profiled_collectives(g, overlapping=concurrent)
    wire = None if g.meta.wire_bytes_per_s is None else 1e6 / g.meta.wire_bytes_per_s
    fit = _fit_timed(nbytes, dur, priced_world_size(g), concurrent, wire, spans & joined_together(g, comm), spans, monotone=True)
    if fit.weak is not None:  # no link to price the all-gathers beside: one fitted to every kind, as elsewhere
        return None
    return replace(fit, apart=True)


def _fit_timed(nbytes: np.ndarray, dur: np.ndarray, n: int, concurrent: bool, wire: float | None, keep: np.ndarray,
               base: np.ndarray | None = None, monotone: bool = False) -> LinkFit:
    """``fit_link`` on the collectives ``keep`` of those ``base`` would fit (default every one), where at least two sizes
    stay apart among them as ``fit_link`` asks and the fit on them tells latency from bandwidth (``LinkFit.weak``): else on
    ``base``, as before; its stalls per collective of the whole sample (0 on those not fitted: their time stays theirs,
    ``passes.comm.instance_residuals``). ``monotone`` (a JAX job on gloo, timed one at a time): where that fit tells
    latency from bandwidth, the instances ``slower_than_larger`` sets apart are not fitted either, and each one's time
    beyond the line fitted to the rest is its stall, kept in its own step (``keep_stalls``), where the rest still tell the
    line; else none is set apart."""
    base = np.ones(len(nbytes), dtype=bool) if base is None else base
    k, b = nbytes[keep], nbytes[base]
    if not len(k) or (b.max() >= 1.5 * b.min() and not _sizes_apart(k)):
        keep = base
    fit = fit_link(nbytes[keep], dur[keep], n, concurrent=concurrent, wire_us_per_byte=wire)
    if fit.weak is not None and not (keep == base).all():  # the rest no longer tell latency from bandwidth: as before
        keep = base
        fit = fit_link(nbytes[keep], dur[keep], n, concurrent=concurrent, wire_us_per_byte=wire)
    slow = np.zeros(len(nbytes), dtype=bool)
    if monotone and not concurrent and fit.weak is None:  # a refinement of a fit the sizes tell, never one made from noise
        slow = slower_than_larger(nbytes, dur, keep)
        rest = keep & ~slow
        if slow.any() and _sizes_apart(nbytes[rest]) and (screened := fit_link(nbytes[rest], dur[rest], n, wire_us_per_byte=wire)).weak is None:
            keep, fit = rest, screened
        else:
            slow[:] = False
    if keep.all() or (fit.stalls is None and not slow.any()):
        return fit
    stalls = np.zeros(len(nbytes))
    if fit.stalls is not None:
        stalls[keep] = fit.stalls
    m = max(n, 2)
    line = 2 * (m - 1) * fit.link.alpha_us + 2 * (m - 1) / m * nbytes * fit.link.beta_us_per_byte
    stalls[slow] = np.maximum(dur[slow] - line[slow], 0.0)
    return replace(fit, stalls=stalls if stalls.any() else None)


def wire_floor(g: Graph) -> float | None:
    """us per byte (as ``AlphaBeta.beta_us_per_byte``) below which no kind's own link of a JAX job's collectives on gloo
    (``jax_on_gloo``) or an FSDP job's profiled on a known wire (``GraphMeta.wire_bytes_per_s``: ``--profiled-bandwidth``)
    is fitted (``profiled_kinds``, with a JAX job's all-gathers set apart, ``gathers_apart``; not their own line, whose
    nodes end with their first rank out); None elsewhere.

    A shaped link carries no byte faster than its rate: where a kind's fit beats it, bytes crossed outside its nodes'
    timed spans. A node is timed from the last rank's join, and the first rank in sends meanwhile, into the socket
    buffers. On ``tests/data/tf-jax/zero-rs-late`` (``bench/frameworks/jax_zero_rs.py``, 1 Gbit/s) the ranks came to the
    1 MB reduce-scatters 3.3 ms apart in 7 of 8 steps and those took 6.9 ms against the wire's 8.9 (9.1-11.4 ms in the
    other kept rounds' steps whose ranks joined within 0.2 ms); at 200 Mbit/s, ranks within 1.7 ms, 43.8-45.7 against
    44.8. The reduce-scatters' link read 145 % of the wire and the 200 Mbit/s what-if came out 10.5 % short. Not tbf's
    bucket (the testbed's 25 kB): on that loopback gloo's 1-8 MB all-reduces from joined ranks took 1.01-1.02 of the
    wire's time at 1 Gbit/s and at 200 Mbit/s, 1.03-1.04 with a 3 kB bucket (``bench/tbf_headstart.py``). What each
    instance of a floored kind measured beside its price stays its own time at every rate (``passes.comm
    .instance_residuals``): a head start is time the schedule gives, not bytes. Not the one line either: through
    all-gathers that measure a share of their transfer (``transfer_spanned`` sets none apart where no other kind shows a
    slope), ``bench/frameworks/jax_fsdp_conv.py``'s read 112 % of its 500 Mbit/s wire, and floored it priced 200 Mbit/s
    +13.3 % (was +9.3; its all-gathers now on their own line, ``gathers_own_line``, and its other kinds floored:
    +0.4 %). Other frameworks' fits beating the wire (TF's loopback at 1.1-3.4 times it) scale by the rate
    ratio, as before (``search.scenario.wire_bandwidth``).

    FSDP's small collectives beat the wire both ways: the netns testbed's tbf port passes 1 ms of its rate at once after
    an idle spell (125 kB at 1 Gbit/s, 25 kB at 200 Mbit/s), and the first rank in sends before the last joins; each saves
    time, not a share of the bytes' time. The HSDP dual encoder (``bench/fsdp_fresh/hsdp_dual_encoder.py --shard 2``,
    1 Gbit/s; ``tests/data/fsdp-fresh/dual-1x2-1gbit``): its 112 kB-a-direction block all-gathers took 0.33 ms (median,
    last join to first rank out) against the wire's 0.90, its 447 kB block reduce-scatters 3.25 against 3.58, the root's
    1.6 MB 13.0 against 13.0: the kinds fitted at 1.3-1.5 times the wire, and scaled by the rate ratio 200 Mbit/s came
    out -7.7 to -16.1 % on four rounds (the same kept profiles floored: -7.4 to +1.2 %)."""
    if not (jax_on_gloo(g) or is_fsdp_graph(g)) or g.meta.wire_bytes_per_s is None:
        return None
    return 1e6 / g.meta.wire_bytes_per_s


def _sizes_apart(nbytes: np.ndarray) -> bool:
    """At least two sizes, the largest at least 1.5 times the smallest: what ``fit_link`` asks to split latency from bandwidth."""
    return len(nbytes) > 0 and len(np.unique(nbytes)) >= 2 and nbytes.max() >= 1.5 * nbytes.min()


def slower_than_larger(nbytes: np.ndarray, dur: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Per collective, whether it is one of ``among`` whose size's every instance took longer than every instance of a
    size at least 1.5 times its bytes (sizes apart as ``fit_link`` asks): the two sizes' times do not overlap, the wrong way
    round for any link (none moves more bytes in less time), so the smaller one's time was not the link's but a stall's,
    whatever share of the sample its instances are. Whole sizes, not single instances: latency-bound sizes near each other
    set instances apart by chance (the testbed's ``jax_fsdp_conv.py`` at 500 Mbit/s: its 20 B and 64 B all-gathers, 49-171
    us, against the 128 B ones' 64-112 us, and the model of the profiled run went +1.91 -> +2.08 %); a whole size of 8
    slower than a whole size of 8 with their times alike has odds of 1 in 12,870.

    The line's robust fit (``_fit_robust``: least absolute deviations, outliers beyond 3 robust standard deviations)
    sets apart a few stalled instances among many, not a size whose instances stalled nearly every step: a cluster at one
    end of the sizes carries the line with it. On ``tests/data/tf-jax/zero-rs-late`` (``bench/frameworks/jax_zero_rs.py``
    on the testbed, 1 Gbit/s) the 4-byte psums took 1.6-4.2 ms in 7 of the 8 steps against 0.65-1.2 ms for the 16 kB
    reduce-scatters, ranks ready 0.1 ms apart (at 200 Mbit/s they took 0.06-0.3 ms: no wire time). A quarter of the
    fitted sample, they carried every line estimator tried (its time per byte against the wire's): least squares 0.56,
    Theil-Sen 0.59, least absolute deviations 0.62, Huber's 0.65, Tukey's bisquare 0.70, the fit with the 3-deviation cut
    0.69 (two of them kept, latency 0.47 ms); 200 Mbit/s was priced 16 % short. Set apart by this: 0.73, latency 0.34 ms,
    -10.5 % (the rest: its 1 MB reduce-scatters, ranks ready 3.3 ms apart, beat the wire). ``_fit_timed`` asks it only
    where the sizes already tell latency from bandwidth, and keeps what it sets apart only where the rest still do: it
    refines a line, never makes one from noise (on the unshaped loopback, ``tf-jax/fsdp-conv``'s all-gathers of 30 B-4 kB
    took 0.2-10 ms as the cores came free: a line made there by setting latency-bound sizes apart kept its 378 kB
    all-reduces' 17-29 ms as stalls, unpriced). Kept to JAX: on every framework (judged 2026-12-06) Horovod's
    ``testbed-autoencoder-w4`` model of its run went +0.43 -> +2.91 %, and no measured TF, DDP or FSDP what-if moved 0.2 points."""
    out = np.zeros(len(nbytes), dtype=bool)
    if among.sum() < 2:
        return out
    sizes, size_of = np.unique(nbytes[among], return_inverse=True)
    size_of = size_of.ravel()
    t = dur[among].astype(float)
    slowest, fastest = np.full(len(sizes), -np.inf), np.full(len(sizes), np.inf)
    np.maximum.at(slowest, size_of, t)
    np.minimum.at(fastest, size_of, t)
    bound = np.minimum.accumulate(slowest[::-1])[::-1]  # per size: the least of the slowest from it on up the sizes
    first = np.searchsorted(sizes, 1.5 * sizes, side="left")  # per size: the first size at least 1.5 times as large
    limit = np.where(first < len(sizes), bound[np.minimum(first, len(sizes) - 1)], np.inf)
    out[among] = (fastest > limit)[size_of]
    return out


def joined_together(g: Graph, comm: np.ndarray) -> np.ndarray:
    """Per collective of ``comm`` (``profiled_comm``), whether its ranks became ready no further apart than its own
    measured time, on a JAX job on gloo (``jax_on_gloo``; elsewhere every one). The node is timed from the
    last rank's join, but the first rank in sends meanwhile: its bytes cross before the timed start, and the time per byte
    reads faster than the wire. On a testbed round of ``bench/frameworks/jax_zero_rs.py`` (``tests/data/tf-jax/zero-rs-late``,
    1 Gbit/s) the ranks came to step 11 and 13's 512 kB reduce-scatters 4.3-5.7 ms apart and those took 2.2 ms against
    the other steps' 4.2: the line read 169 % of the wire and 200 Mbit/s was priced -31 %; left out, 136 % and -16 %.
    The ready points are those the graph builder measured (``Graph.ready_spread``, ``graph.shared_collectives``); a
    collective without that record (one ready rank: a chained join; a node a pass made or averaged) stays. Only where
    the wire the run was profiled at is known (``GraphMeta.wire_bytes_per_s``, a shaped link): on the unshaped loopback (``tests/data/tf-jax/zero-rs``) the
    transfers take 0.1-2 ms, less than the ranks' scheduling spread, 16 of 40 were left out, the rest explained 2 % of the
    durations and the model of the profiled run came out +8.8 % (was +0.4). Kept to JAX: on every framework (judged
    2026-12-06) TF's kept rounds came 0.4-0.6 points closer, but Horovod ``hvd_text`` models went -1.4 -> +4.4 %, +0.3 -> +3.0 %."""
    if not jax_on_gloo(g) or g.meta.wire_bytes_per_s is None or not len(comm):
        return np.ones(len(comm), dtype=bool)
    spread = g.ready_spread.at(comm)
    return ~(spread > g.dur[comm])  # NaN (not recorded) compares False: kept


def transfer_spanned(g: Graph, comm: np.ndarray) -> np.ndarray:
    """Per collective of a JAX job's ``comm`` (``profiled_comm``), whether its node's time spans its transfer: all but the
    all-gathers, where one of the other kinds shows sizes to fit a slope to (the largest at least 1.5 times the smallest,
    as ``fit_link`` asks: a line through two kinds' sizes mixes their costs per byte, the fault this avoids); else every one.
    On 2 ranks gloo's all-gather ends on one rank while the other's half still crosses (the rest lies in the next
    collective's join, ``passes.comm._chained_joins``): on the testbed's shaped loopback (``bench/frameworks/jax_zero_rs.py``,
    1 Gbit/s, the kept round of 2026-12-05 20:32) the all-gathers' nodes took 0.49-0.76 of their medium time (medians per
    size), the reduce-scatters' 0.98-1.18. The one line through both read a link 127 % of the wire, set 21 ms of the
    reduce-scatters' 112 apart as stalls, and 200 Mbit/s priced them ~20 % short: the step -5.3 %, now +1.4 %."""
    spans = g.comm_kind[comm] != CommKind.ALL_GATHER
    for kind in np.unique(g.comm_kind[comm][spans]).tolist():
        sizes = g.nbytes[comm][spans & (g.comm_kind[comm] == kind) & (g.nbytes[comm] > 0)]
        if len(sizes) and sizes.max() >= 1.5 * sizes.min():
            return spans
    return np.ones(len(comm), dtype=bool)


def keep_stalls(g: Graph, fit: LinkFit | None = None) -> Graph:
    """``g`` as measured with each stalled collective's time beyond the link fitted to them (``LinkFit.stalls``) moved to
    the gap before its transfer starts (its join's; each rank's ready point where it has none), where no link change or
    re-pricing touches it: the stall stays in its own step. Spread over every collective as latency, wide_deep's one
    91 ms scalar all-reduce (a 235 ms step among 37-49 ms ones, both ranks) put 0.7 ms on each of the 136 in the window:
    the model's mean step matched (+0.1 %), its median was +26 %, and a 200 Mbit/s what-if's median +43 %. Put after the
    transfer (its consumers' gaps) a stall no longer overlapped what the rank ran meanwhile (tests/data/tf/widedeep: the
    mean step +5 %). A graph already priced (``meta.topology``) is returned as is. ``retime_collectives`` keeps a Horovod
    graph's stalls on the transfers instead, where a slower wire can hide them (``passes.comm._horovod_stalls``). ``fit``:
    ``link_fit(g)`` where the caller has it."""
    if g.meta.topology is not None or is_ps_graph(g):
        return g
    try:
        stall = fitted_stalls(g, fit)
    except DagprofError:
        return g
    if not stall.any():
        return g
    gap = g.gap.copy()
    for c in find_collectives(g):
        if stall[c.comm] > 0:
            gap[c.head] += stall[c.comm]
    return g.replace(gap=gap)


def fitted_stalls(g: Graph, fit: LinkFit | None = None) -> np.ndarray:
    """Per node, us: each collective's time beyond the link fitted to ``g``'s (``LinkFit.stalls``; ``fit``: ``link_fit(g)``
    where the caller has it), 0 elsewhere: the one pairing of the fit's stalls with the collectives it was fitted to
    (``profiled_comm`` as ``link_fit`` chose them)."""
    fit = fit or link_fit(g)
    out = np.zeros(len(g))
    if fit.stalls is not None:
        out[profiled_comm(g, overlapping=g.meta.comm_lanes > 1)] = fit.stalls
    return out


def pipelined(g: Graph) -> bool:
    """Whether a collective's time beyond the wire runs beside its transfer, where a slower wire hides it: Horovod's fused
    responses, whose buffer copies and reductions on the cores run beside the ring's transfer (its timeline shows them
    so; ``split_at_wire``'s ``pipelined``). Its link is the wire with the fit as a floor (each profiled transfer's own time,
    where the wire is known), and its stalls stay on their transfers (``passes.comm._horovod_stalls``) rather than in the
    gap before them (``keep_stalls``). The other readers'
    collectives (gloo's, NCCL's, TF's, XLA's) are one call each whose time the wire does not hide."""
    return g.meta.horovod is not None


def fit_topology(g: Graph, fit: LinkFit | None = None) -> Topology:
    """A flat topology (one rank per host) whose link reproduces the profiled collectives' transfer times.

    The fitted latency becomes a per-collective overhead, not a per-message wire latency: at
    the profiled size they cost the same, but a profile's latency is mostly software (thread
    hand-off, queueing) that does not grow with the ring's 2(N-1) steps; scaled to thousands of
    ranks as wire latency it would dominate everything. Give network latency with ``set_link``. ``fit``: ``link_fit(g)``
    where the caller has it.
    """
    n = priced_world_size(g)
    fit = fit or link_fit(g)
    link = fit.link
    wire = AlphaBeta(0.0, link.beta_us_per_byte, link.gamma_us_per_byte)
    overhead = _collective_overhead_us(g, fit)
    kinds = fit.kinds or (profiled_kinds(g, overhead, fit) if fit.weak is None else ())
    t = Topology(max(n, 1), 1, wire, wire, overhead, kinds, half_duplex=g.meta.half_duplex)
    if g.meta.wire_bytes_per_s is None:
        return t
    kept = unhidden_us_per_byte(g, 1e6 / g.meta.wire_bytes_per_s)
    return split_at_wire(t, g.meta.wire_bytes_per_s, pipelined=pipelined(g), kept_us_per_byte=kept)


# Gradient dtypes whose Horovod all-reduces keep beside any wire the least time per byte they took beyond the profiled
# one (``unhidden_us_per_byte``): measured on jobs all fp16 (kept) and all fp32 (none kept); other mixes are said
# (``unhidden_note``)
UNHIDDEN_DTYPES = frozenset({"float16"})
# The transfers that tell a time per byte: those of at least this share of the largest one's bytes. Smaller ones pass in
# the shaper's bucket and a few TCP segments, some faster than the wire's rate (hvd_autoencoder's 65 kB responses at
# 0.7-0.8 times the 500 Mbit/s wire's time), and their latency swamps the bytes' time.
LARGE_SHARE = 0.5


def unhidden_us_per_byte(g: Graph, wire_us_per_byte: float) -> float:
    """A Horovod profile's time per byte beyond the wire that no wire rate hides (``split_at_wire``'s ``kept_us_per_byte``):
    where every all-reduced gradient is half precision, the least such time among its large transfers (``LARGE_SHARE``),
    of which a slower wire still shows one segment's sum (``costmodel.gloo_ring.unhidden_reduce_us``); 0 elsewhere. us
    per byte, on the ring's 2 (N - 1) / N share of each transfer's bytes, as ``AlphaBeta.beta_us_per_byte``.

    The same script (hvd_autoencoder.py, 2 ranks, the testbed 2026-12-04) all-reduced fp16 and fp32 gradients: fp16's
    transfers ran at 1.16-1.17 (load 2.4-3.1) and 1.43-1.78 (load 5) times the 500 Mbit/s wire, and at 200 Mbit/s still
    at 1.03 and 1.27-1.34 times it; fp32's (``Compression.none``, 2 rounds at load 6.6-11.4) at 1.37-1.39 times the 500 Mbit/s
    wire and 0.99-1.00 times the 200 Mbit/s one (its least excess at 500, 3.7-6.0 ns a byte, gone), as hvd_sparse_gru's
    fp32 at 1.02-1.16 and 1.00-1.01 (medians over each job's large transfers, over the wire's payload rate as the
    200 Mbit/s job carried it). The fastest transfers show the work on the cores every fp16 buffer costs (gloo's
    element-wise sums), the slower ones' extra the load, which a slower wire hides. Those sums run between a segment's
    receive and the next send, beside the other segment in flight: kept whole, the least excess of the two-host
    testbed's 1 Gbit/s profiles (12.2 and 16.9 ns a byte, quiet), where the sums outlasted the segments' wire time,
    priced the 200 Mbit/s transfers 11-21 % over those measured (8-10 ns a byte beyond the wire); one segment's sum is
    7.2 and 9.5. Where the sums already hid behind the profiled wire (the loopback at 500 Mbit/s, quiet) it is the
    whole least excess, as before."""
    dtypes = _allreduced_dtypes(g)
    if not dtypes or not all(dt in UNHIDDEN_DTYPES for dt in dtypes):
        return 0.0
    nbytes, dur = profiled_collectives(g)
    n = max(priced_world_size(g), 2)
    share = 2 * (n - 1) / n * nbytes.astype(float)
    large = np.flatnonzero(nbytes >= LARGE_SHARE * nbytes.max())
    i = large[int(np.argmin((dur[large] - share[large] * wire_us_per_byte) / share[large]))]
    return unhidden_reduce_us(float(dur[i] - share[i] * wire_us_per_byte), float(nbytes[i]), n, wire_us_per_byte) / float(share[i])


def _allreduced_dtypes(g: Graph) -> list[str]:
    """The dtype of each gradient a Horovod job all-reduced (grouped ones too), as sent."""
    hv = g.meta.horovod
    return [dt for t, dt in (hv.tensor_dtypes.items() if hv is not None else ()) if tensor_collective(t) == "allreduce"]


def unhidden_note(g: Graph) -> list[str]:
    """Where ``unhidden_us_per_byte``'s rule is a guess, said with the count: a Horovod job whose all-reduced gradients are
    some of ``UNHIDDEN_DTYPES`` and some not, measured neither way; nothing of theirs is kept beside the wire."""
    dtypes = _allreduced_dtypes(g)
    some = sum(dt in UNHIDDEN_DTYPES for dt in dtypes)
    if not 0 < some < len(dtypes):
        return []
    return [f"{some} of the {len(dtypes)} all-reduced gradients are {'/'.join(sorted(UNHIDDEN_DTYPES))}, the rest "
            f"{'/'.join(sorted(set(dtypes) - UNHIDDEN_DTYPES))}: the time per byte beyond the wire that half-precision all-reduces "
            "keep at every rate was measured on jobs all of one or the other, so none is kept here (as for fp32's)"]


def profiled_kinds(g: Graph, overhead_us: float, fit: LinkFit) -> tuple[tuple[str, AlphaBeta], ...]:
    """Per collective kind of an FSDP profile with more than one, the link on which its collectives cost, beside the
    fit's fixed ``overhead_us``, what they took in all less the stalls the fit set apart (``Topology.kinds``). One fit to every kind prices gloo's
    all-gather as half an all-reduce of the gathered bytes and its reduce-scatter as a whole one; on the 2-rank
    testbed (1 Gbit/s) that put each all-gather 2-8 % above its measured time and each reduce-scatter 1-4 % below,
    and a link ratio multiplied both (the vendored pair ``tests/data/fsdp/testbed-alternating-*``: 200 Mbit/s +1.0 % ->
    -0.1 %). Only where the one fit tells bandwidth from latency (``LinkFit.weak``): else a kind's share of the
    durations beyond the overhead is noise (the 2-step ``fsdp/reshard`` recording: +2.0 % off its own replay). ``fit``:
    ``link_fit(g)``, whose stalls and all-gathers set apart (``LinkFit.apart``) it takes."""
    return tuple((kind, ab) for kind, ab, _ in _kind_links(g, overhead_us, fit))


def floored_kinds(g: Graph, fit: LinkFit) -> tuple[str, ...]:
    """The kinds whose own links (``profiled_kinds``) the wire floored (``wire_floor``), on ``fit``'s overhead."""
    if fit.kinds or fit.weak is not None or wire_floor(g) is None:
        return ()
    return tuple(kind for kind, _, floored in _kind_links(g, _collective_overhead_us(g, fit), fit) if floored)


def _collective_overhead_us(g: Graph, fit: LinkFit) -> float:
    """The fitted latency as a per-collective overhead (``fit_topology``): the ring's 2(N-1) steps' at the priced world size."""
    return 2 * (max(priced_world_size(g), 2) - 1) * fit.link.alpha_us


def _kind_links(g: Graph, overhead_us: float, fit: LinkFit) -> list[tuple[str, AlphaBeta, bool]]:
    """``profiled_kinds``' links, each with whether the wire floored it (``wire_floor``; never the all-gathers a JAX fit set
    apart, whose nodes end with their first rank out: ``transfer_spanned``; on their own line where the fit has one,
    ``LinkFit.gathers``)."""
    sample = _kind_sample(g, fit.apart)
    if sample is None:
        return []
    comm, kinds, _, wire, dur = sample
    floor = wire_floor(g)
    out = []
    dur = dur - fitted_stalls(g, fit)[comm]  # each stall stays in its own step as measured (``keep_stalls``), not priced
    # again in its kind's link: a 2-rank ResNet's (``bench/fsdp_fresh/workers_rounds.py``, 100 Mbit/s) 13.8 ms a step of them
    # counted twice put the model of its profiled run +4.9 % over its replay, and --workers 4 priced them again 1.5 times
    gather = priced_kind(CommKind.ALL_GATHER).label
    for kind in np.unique(kinds).tolist():
        sel = kinds == kind
        transfer = float(dur[sel].sum()) - overhead_us * int(sel.sum())
        if kind == gather and fit.gathers is not None:
            out.append((kind, fit.gathers, False))
        elif transfer > 0 and wire[sel].sum() > 0:  # no wire: HSDP's all-reduces over a replicate degree of 1 (``_group_share``)
            beta = transfer / float(wire[sel].sum())
            floored = floor is not None and beta < floor and not (fit.apart and kind == gather)
            out.append((kind, AlphaBeta(0.0, floor if floored else beta), floored))
    return out


def torch_ddp(g: Graph) -> bool:
    """A PyTorch job's collectives of plain data parallelism (DDP's buckets, a script's own calls), not FSDP's (their kinds
    on links of their own: ``profiled_kinds``) nor a parameter server's, timed one at a time (``GraphMeta.comm_lanes``:
    where two overlap, which of them a stretch of time was is not known, ``fit_link``): one timed at 0 us keeps it
    (``passes.comm.instance_residuals``)."""
    return g.meta.framework is None and not is_fsdp_graph(g) and not is_ps_graph(g) and g.meta.comm_lanes <= 1


def jax_on_gloo(g: Graph) -> bool:
    """A JAX job's collectives through gloo (XLA's CPU client), whose all-gathers' nodes end with their first rank out
    (``transfer_spanned``)."""
    return not is_fsdp_graph(g) and g.meta.framework == "jax" and (g.meta.backend or "gloo") == "gloo"


def _kind_sample(g: Graph, apart: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(nodes, kinds, all-reduce-equivalent bytes, ring wire bytes, us) of an FSDP profile's, or a JAX one's with its
    all-gathers apart (``apart``: ``LinkFit.apart``), priced collectives with a measured duration and size, where they are
    of more than one kind; else None. A JAX job's bytes are those it is priced at on one medium (``medium_equivalent_bytes``),
    an FSDP job's as before."""
    if not is_fsdp_graph(g) and not apart:
        return None
    mask = priced_comm(g)
    comm = np.array([c.comm for c in find_collectives(g) if mask[c.comm] and g.dur[c.comm] > 0 and g.nbytes[c.comm] > 0], np.int64)
    if not len(comm):
        return None
    kinds = np.array([priced_kind(CommKind(k)).label for k in g.comm_kind[comm].tolist()])
    if len(np.unique(kinds)) < 2:
        return None
    n = max(priced_world_size(g), 2)
    equiv = (allreduce_equivalent_bytes(g, comm) if is_fsdp_graph(g) else medium_equivalent_bytes(g, comm, g.meta.half_duplex)).astype(float)
    return comm, kinds, equiv, 2 * (n - 1) / n * equiv, g.dur[comm].astype(float)


def kinds_fit(g: Graph) -> tuple[float, AlphaBeta, tuple[tuple[str, AlphaBeta], ...], float] | None:
    """Where one link fits an FSDP profile's collectives too poorly to split latency from bandwidth (``LinkFit.weak``)
    because its kinds cost differently per byte: one fixed overhead per collective shared by every kind, and each kind's
    own time per wire byte, fitted together by least squares (the overhead dropped where it comes out negative): (overhead
    us, the all-reduce-equivalent link of the kinds' total, ``Topology.kinds``, R^2). None unless every kind has sizes that
    show its slope (the largest at least 1.5 times the smallest, as ``fit_link`` asks of one link), every slope is positive
    and the kinds' sizes explain the durations (R^2 at least ``MIN_R2``).

    gloo's collectives of CUDA tensors copy through the host, and its all-gather and all-reduce differ beyond their
    bytes: on the 2-rank H200 run (FSDP2 per block, gloo, Kineto) an all-gather of a 50 MB block spent ~57 ms exchanging
    and ~10 ms copying the gathered halves on the host, the block's all-reduce (FSDP's reduce-scatter on gloo) ~29 ms
    exchanging and ~6 ms dividing on the host (AVG): 2.5 against 0.64 ns per wire byte as fitted. One link fitted to both explained
    1 % of their durations, put it all in latency (46.5 ms a collective) and priced the root's 1-2 MB collectives,
    measured 1-4 ms, at 47 ms: the model of the profiled run +14.8 % off its replay (``--raw``). Fitted per kind with one
    overhead: R^2 0.98, +1.6 %."""
    sample = _kind_sample(g, apart=False)  # ``link_fit`` asks only where ``gathers_apart`` set none apart
    if sample is None:
        return None
    _, kinds, equiv, wire, dur = sample
    names = np.unique(kinds).tolist()
    for kind in names:
        sizes = equiv[kinds == kind]
        if sizes.max() < 1.5 * sizes.min():
            return None
    slopes = np.stack([np.where(kinds == kind, wire, 0.0) for kind in names], axis=1)
    coef = np.linalg.lstsq(np.column_stack([np.ones(len(dur)), slopes]), dur, rcond=None)[0]
    if coef[0] < 0:
        coef = np.concatenate([[0.0], np.linalg.lstsq(slopes, dur, rcond=None)[0]])
    pred = coef[0] + slopes @ coef[1:]
    spread = float(((dur - dur.mean()) ** 2).sum())
    r2 = 1.0 - float(((dur - pred) ** 2).sum()) / spread if spread > 0 else 0.0
    if (coef[1:] <= 0).any() or r2 < MIN_R2:
        return None
    overhead = float(coef[0])
    total = AlphaBeta(0.0, float((dur.sum() - overhead * len(dur)) / wire.sum()))
    return overhead, total, tuple((kind, AlphaBeta(0.0, float(b))) for kind, b in zip(names, coef[1:])), r2


def split_at_wire(t: Topology, wire_bytes_per_s: float, pipelined: bool = False, kept_us_per_byte: float = 0.0) -> Topology:
    """The fitted link split at the wire rate the profile ran at (``GraphMeta.wire_bytes_per_s``: ``dagprof whatif
    --profiled-bandwidth``), so that the exit lags measured are scaled from the wire's time per byte too: the wire's time
    per byte stays bandwidth, which a link change scales; the fit's time per byte beyond it becomes per-byte work (gamma,
    as a reduction's) that no link change scales. On a loaded 2-core machine gloo's collectives ran at 45-71 % of the shaped
    wire (busy cores, not the link), and a slower link then stretched that CPU time as wire time: +50 to +80 % on them. At
    the profiled rate the ring prices each collective as fitted (gamma weighs (N-1)/N, beta 2(N-1)/N of its bytes). A fit
    no slower than the wire stays whole: there is no excess to keep. Each kind's own link (``Topology.kinds``) splits the
    same way.

    ``pipelined`` (Horovod: a fused buffer's copies and reductions on the cores run beside its ring's transfer): the wire
    alone, no latency, with the whole fit as a floor (``Topology.floor``) that a slower wire hides: on the quiet testbed
    hvd_transformer's fused all-reduces ran at 1.08-1.31 times the wire's time at 500 Mbit/s (fit 90-93 % of the wire,
    latency 0.9-5.4 ms) and at 1.00-1.01 times it at 200 Mbit/s: the excess did not outlast the slower wire, and kept as
    work after it the collectives came out +6 to +26 % over those measured there. A faster wire hides no more of it: the
    floor is then the fit less the profiled wire's time (``Topology.floor_wire``) plus the faster wire's, what the profile
    measured beyond the wire kept. With the whole fit as the floor there too, a faster wire gained nothing: profiled at
    200 Mbit/s (fits 98-101 % of the wire) hvd_sparse_gru's kept rounds came out +70 to +88 % on the median step at 500.
    ``kept_us_per_byte`` (``unhidden_us_per_byte``: fp16 gradients' all-reduces) of the fit's time per byte beyond the wire
    stays beside the wire at every rate (gamma), the rest of the fit a floor as above.

    A Horovod fit no slower per byte than the wire but with a latency takes the same floor: that latency is its transfers'
    time beyond the wire too (a wait for the core the ranks' backward holds, on a host of one core), which the slower wire
    hid. Kept as latency beside it, hvd_vit_warmup's (2 ms a response, message size explaining 5-8 % of its responses'
    times at 1 Gbit/s, quiet two-host rounds 2026-12-06) put 84-92 ms of collectives a step at 200 Mbit/s where 65-68 were
    measured, the wire's 61; the step +17.5 and +32.6 %, as a floor +5.0 and +26.0 (the rest: that job fused its tensors
    into 6 responses a step, the profile 11). A fit a few % either side of the wire had its latency kept or hidden, and the
    model of the profiled run moved up to 2.6 % off it; now 0.0 on all 19 kept rounds this touched (``docs/evidence.md``)."""
    wire = 1e6 / wire_bytes_per_s
    latency = t.inter.beta_us_per_byte > 0 and (t.overhead_us > 0 or t.inter.alpha_us > 0)  # one that shows no time per byte keeps its time
    if pipelined and (t.inter.beta_us_per_byte > wire or latency):
        ab = AlphaBeta(0.0, wire, 2 * max(min(kept_us_per_byte, t.inter.beta_us_per_byte - wire), 0.0))
        alone = replace(t, inter=ab, intra=ab, overhead_us=0.0, kinds=tuple((k, ab) for k, _ in t.kinds))
        return replace(alone, floor=t, floor_wire=alone)

    def split(ab: AlphaBeta) -> AlphaBeta:
        if ab.beta_us_per_byte <= wire:
            return ab
        return AlphaBeta(ab.alpha_us, wire, ab.gamma_us_per_byte + 2 * (ab.beta_us_per_byte - wire))

    return replace(t, inter=split(t.inter), intra=split(t.intra), kinds=tuple((k, split(ab)) for k, ab in t.kinds))


MIN_R2 = 0.5  # below it, message size explains too little of the durations to split latency from bandwidth


def fit_link(nbytes: np.ndarray, dur_us: np.ndarray, workers: int, concurrent: bool = False,
             wire_us_per_byte: float | None = None) -> LinkFit:
    """Latency and bandwidth fitted together to profiled ring all-reduces (absolute residuals, so
    the fit reproduces their total time), with what keeps the two apart. ``wire_us_per_byte``: the wire the run was
    profiled at, where known (``_fit_one_size``).

    Per-collective times are trusted only from a one-at-a-time channel. When collectives
    overlap (gloo's two workers share the link), completion spacing splits a pair's time
    between its two members almost at random, and only the total is meaningful: bandwidth is
    then total time over total bytes, as with a single message size, where latency and
    bandwidth cannot be told apart either; the fit says so (``weak``).
    """
    n = max(workers, 2)
    share = 2 * (n - 1) / n
    sizes = len(np.unique(nbytes))
    moved = float((share * nbytes).sum())
    if moved <= 0:  # a one-rank graph's (``scale_fsdp_workers(g, 1)``: an all-gather of one rank moves nothing): as time per
        # byte, its durations over no bytes were an infinitely slow link in the topology
        return LinkFit(AlphaBeta(0.0, 0.0), len(nbytes), sizes, None, "no collective moved a byte between ranks, so no bandwidth shows in them")
    total = LinkFit(AlphaBeta(0.0, float(dur_us.sum() / moved)), len(nbytes), sizes, None, None)
    if concurrent:
        return _fit_total(nbytes, dur_us, share, total)
    if sizes < 2 or nbytes.max() < 1.5 * nbytes.min():
        return _fit_one_size(nbytes, dur_us, n, total, wire_us_per_byte)
    slope = np.polyfit(share * nbytes, dur_us, 1)[0]
    stalls = np.zeros(len(nbytes))
    if slope <= 0:  # durations do not grow with size: all latency, no bandwidth seen
        link = AlphaBeta(float(dur_us.mean()) / (2 * (n - 1)), 0.0)
    else:
        link, stalls = _fit_robust(nbytes, dur_us, n)
    priced = dur_us - stalls  # what the link prices
    pred = 2 * (n - 1) * link.alpha_us + share * nbytes * link.beta_us_per_byte
    spread = float(((priced - priced.mean()) ** 2).sum())
    r2 = 1.0 - float(((priced - pred) ** 2).sum()) / spread if spread > 0 else 1.0
    weak = None
    if slope <= 0:
        weak = "the collectives' durations do not grow with their size, so no bandwidth shows in them"
    elif r2 < MIN_R2:
        weak = f"message size explains only {max(r2, 0.0):.0%} of the collectives' durations"
    return LinkFit(link, len(nbytes), sizes, r2, weak, stalls if stalls.any() else None)


def _fit_total(nbytes: np.ndarray, dur_us: np.ndarray, share: float, total: LinkFit) -> LinkFit:
    """Overlapping collectives: the sized ones' total time over their bytes. What did not go into moving bytes stays on
    its instance as measured (``LinkFit.stalls``): the whole time of those of 0 B (a size the trace does not give: DDP
    ``join()``'s one-element all-reduces at each forward), and an outlier's excess over the total's rate (``_outliers``, among those timed above 0 us).
    Counted as bytes' time, ``bench/review6/lstm_join.py``'s join all-reduces, 10-28 ms each where the scheduler kept
    gloo's thread waiting on a loaded machine, fitted its 3.5 MiB of buckets a step at 0.63 Gbit/s, and the model of the
    profiled run came out 19.7 % over its replay; a stock gloo DDP trace's (``tests/data/gloo-windows/same``) first
    128 B buffer broadcast, 4.1 ms waiting for the late rank, priced its 92 kB buckets 31 % over their measured mean and
    the model came out 6.9 % over its replay."""
    weak = "the collectives overlap on the link, so only their total time is known"
    sized = nbytes > 0
    if not sized.any():
        return replace(total, weak=weak)
    per_byte = share * nbytes.astype(float)
    beta = float(dur_us[sized].sum() / per_byte[sized].sum())
    timed = sized & (dur_us > 0)  # those at 0 us had their time counted on another: no measure of the spread
    keep = sized.copy()
    keep[timed] = ~_outliers((dur_us - per_byte * beta)[timed])
    if keep.any() and not keep[sized].all():
        # a stall only beyond what any partner could have lent it: the largest one's time at the others' rate (an
        # instance beside another on the link can carry both's time: the CLIP job's 1.6 MB bucket took 6.4 ms where the
        # same bucket took 0.9 ms beside a 6.2 MB one, priced at 5.9 ms)
        rest = float(dur_us[keep].sum() / per_byte[keep].sum())
        keep |= sized & (dur_us - per_byte * rest <= rest * per_byte.max())
        beta = float(dur_us[keep].sum() / per_byte[keep].sum())
    stalls = np.where(sized, np.where(keep, 0.0, np.maximum(dur_us - per_byte * beta, 0.0)), dur_us)
    notes = [f"the {int((~sized).sum())} of 0 B" if (~sized).any() else "", f"{int((sized & ~keep).sum())} outlier(s)' excess" if (sized & ~keep).any() else ""]
    notes = [n for n in notes if n]
    return replace(total, link=AlphaBeta(0.0, beta), weak=weak + (f"; {' and '.join(notes)} stay as measured" if notes else ""),
                   stalls=stalls if stalls.any() else None)


def _outliers(r: np.ndarray) -> np.ndarray:
    """Per residual from a fitted line: above the residuals' median by more than 3 robust standard deviations (1.4826 x
    their median absolute deviation), an instance slower for what the wire does not do."""
    mid = float(np.median(r))
    return r > mid + 3 * 1.4826 * float(np.median(np.abs(r - mid)))


def _fit_robust(nbytes: np.ndarray, dur_us: np.ndarray, n: int) -> tuple[AlphaBeta, np.ndarray]:
    """The least-squares line through the collectives that are not outliers, and each outlier's excess over that line,
    which stays on that instance (``keep_stalls``), so the total is kept.

    A few instances slower for what the wire does not do (a descheduled thread on a loaded host: one of Horovod's
    2.2 MB fused all-reduces took 228 ms among 65-75 ms ones at 500 Mbit/s) pulled the slope and scaled with the
    link as bandwidth (predicted +10 to +16 % at 200 Mbit/s). An outlier lies above the
    least-absolute-deviation line (which the instances' medians set, not their means) by more than 3 robust
    standard deviations (1.4826 x the residuals' median absolute deviation). Without outliers this is the plain
    least-squares fit. The median line itself does not price: TF's loopback collectives of 0 B, 100 KB and 512 KB
    lie on no one line, and it priced the 0 B ones at twice their time (the model of the profiled run 3-5 % off)."""
    a = np.stack([np.full(len(nbytes), 2.0 * (n - 1)), 2 * (n - 1) / n * nbytes.astype(float)], axis=1)
    w = np.ones(len(nbytes))
    for _ in range(50):  # iteratively reweighted least squares: weights 1/|residual| minimise the absolute deviations
        coef = np.linalg.lstsq(a * w[:, None], dur_us * w, rcond=None)[0]
        w = 1.0 / np.sqrt(np.maximum(np.abs(dur_us - a @ coef), 1.0))
    keep = ~_outliers(dur_us - a @ coef)
    if keep.all() or len(np.unique(nbytes[keep])) < 2:
        return fit_alpha_beta(nbytes, dur_us, n, relative=False), np.zeros(len(nbytes))
    link = fit_alpha_beta(nbytes[keep], dur_us[keep], n, relative=False)
    pred = 2 * (n - 1) * link.alpha_us + 2 * (n - 1) / n * nbytes * link.beta_us_per_byte
    return link, np.where(keep, 0.0, np.maximum(dur_us - pred, 0.0))


def _fit_one_size(nbytes: np.ndarray, dur_us: np.ndarray, n: int, total: LinkFit, wire_us_per_byte: float | None = None) -> LinkFit:
    """Collectives of about one size: sizes cannot split latency from bandwidth, but repeats of one size can bound it.
    Their bytes are alike, so what the slower instances took beyond the fastest is not wire time: the link is no slower
    than the fastest instance per byte, and the rest of the mean is per-collective latency (JAX's one fused all-reduce a
    step on a shaped link: 67-81 ms each, which as bandwidth alone scaled 5-8 % too much to a slower link). The total is
    kept; with one instance, or all alike, this is the bandwidth-only fit.

    No byte crosses faster than the wire the run was profiled at (``wire_us_per_byte``, where known): an instance faster
    than it had bytes cross before its timed start (the first rank in sends while the last is still computing), so the
    time per byte is the wire's where the instances' mean is at least the wire's, and only the rest of the mean is latency.
    From the fastest, a stock-profiled DDP embedding model's 7.8 MB all-reduces on the 1 Gbit/s testbed (121.4-140.0 ms,
    the wire's 129.9; ``bench/ddp_fresh/plain_embed.py``) priced 200 Mbit/s at 618 ms against the 645-650 ms a 200 Mbit/s
    profile measured; at the wire, 652. Where the mean beats the wire too, the timed transfers do not show the wire (TF's
    loopback fits at 1.1-3.4 times it): the fastest stays, and the fit scales by the rate ratio (``search.scenario
    .wire_bandwidth``)."""
    share = 2 * (n - 1) / n * nbytes
    ok = share > 0
    if ok.sum() < 2:
        return replace(total, weak="the collectives are all about one size")
    beta = float((dur_us[ok] / share[ok]).min())
    how = "bandwidth from the fastest"
    if wire_us_per_byte is not None and beta < wire_us_per_byte <= float(dur_us[ok].sum() / share[ok].sum()):
        beta, how = wire_us_per_byte, "bandwidth the wire's (the fastest beat it: bytes crossed before its start)"
    alpha = max(float(dur_us.mean() - beta * share.mean()), 0.0) / (2 * (n - 1))
    return replace(total, link=AlphaBeta(alpha, beta), weak=f"the collectives are all about one size: {how}, the slower ones' excess as latency")
