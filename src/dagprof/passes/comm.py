"""Communication what-ifs on the coarse graph: link bandwidth/latency, collective scheme.

The builder gives one COMM node per collective instance (rank -1, on a COMM device,
``dur`` = measured transfer). The first pass that changes communication fits a
``Topology`` to those measured (nbytes, dur) pairs (``fit_topology``), stores it in
``graph.meta.topology`` with the scheme in ``meta.scheme``, and from then on every
COMM node costs ``allreduce_us(nbytes, topology, scheme)`` (an FSDP all-gather or reduce-scatter: the
all-reduce of the same cost, ``graph.build_fsdp.allreduce_equivalent_bytes``): one consistent model for
old and new collectives. Where the topology has a link measured for a collective's kind (``Topology.kinds``,
``dagprof calibrate``), an FSDP collective of that kind is priced on that link instead (and, from a version-3 file,
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

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ..costmodel.alphabeta import AlphaBeta, fit_alpha_beta
from ..costmodel.collectives import allreduce_us
from ..costmodel.topology import CollectiveSpec, Scheme, Topology, kind_of_collective
from ..errors import DagprofError
from ..graph.build_fsdp import allreduce_equivalent_bytes, is_fsdp_graph
from ..graph.build_ps import DONE, ISSUE, is_ps_graph, rebuild_ps
from ..graph.collectives import add_allreduce
from ..graph.dag import Device, DeviceKind, Graph, GraphBuilder
from ..graph.meta import PsLinkFit
from ..graph.replay_result import ReplayResult
from ..traces.events import Kind
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


def without_transfers(g: Graph, colls: list[Collective]) -> tuple[GraphBuilder, np.ndarray]:
    """A builder holding ``g`` less the transfer nodes of ``colls``, and where each kept node went (``GraphBuilder.from_graph``):
    what a pass starts from that puts other transfers in their place."""
    drop = np.zeros(len(g), dtype=bool)
    drop[[c.comm for c in colls]] = True
    return GraphBuilder.from_graph(g, ~drop)


def graph_world_size(g: Graph) -> int:
    return int(g.meta.world_size or g.world_size)


def hybrid(g: Graph) -> bool:
    """True when the graph's collectives serve more than data parallelism (tensor, pipeline, expert groups)."""
    return g.meta.parallel is not None and g.meta.parallel.hybrid


def priced_world_size(g: Graph) -> int:
    """Ranks the modelled collectives span: the data-parallel group of a hybrid job, else every rank."""
    return g.meta.parallel.dp_size if hybrid(g) and g.meta.parallel.dp_size else graph_world_size(g)


def priced_comm(g: Graph) -> np.ndarray:
    """The shared COMM nodes the link model prices. In a hybrid job only the data-parallel ones: the others
    (TP, PP, EP/CP, unknown) keep their measured times, since their groups and traffic are not modelled."""
    mask = (g.kind == Kind.COMM) & (g.rank < 0)
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

    def describe(self) -> str:
        r2 = "" if self.r2 is None else f", R^2 {self.r2:.2f}"
        return f"fitted to {self.collectives} collectives of {self.sizes} size(s){r2}"


def profiled_collectives(g: Graph, overlapping: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(all-reduce-equivalent bytes, transfer us) of every priced collective with a measured duration (``profiled_comm``);
    0 B ones carry latency alone."""
    comm = profiled_comm(g, overlapping)
    return allreduce_equivalent_bytes(g, comm), g.dur[comm].astype(float)


def profiled_comm(g: Graph, overlapping: bool = False) -> np.ndarray:
    """The priced collectives with a measured duration, the link is fitted to. ``overlapping`` (collectives that share
    the link on several lanes, whose total alone is known): those measured at 0 us too, since their bytes crossed the
    link within the others' time (a 1.5 MB gloo bucket beside an 8.4 MB one came out 0 us each step, and without its
    bytes the link was fitted 15 % slow)."""
    mask = priced_comm(g)
    comm = np.array([c.comm for c in find_collectives(g) if mask[c.comm]], dtype=np.int64)
    comm = comm[(g.dur[comm] >= 0) if overlapping else (g.dur[comm] > 0)] if len(comm) else comm
    if not len(comm) or not (g.nbytes[comm] > 0).any():
        if hybrid(g):
            why = "; nothing tells the unknown ones' dimension: no group description, pass or DDP bucket" if Dim.UNKNOWN in g.meta.parallel.dims else ""
            raise DagprofError(f"not modelled: what-ifs re-price data-parallel collectives only, and this trace has none of known size and "
                               f"duration (its collectives: {g.meta.parallel.describe()}{why})")
        raise DagprofError("the trace has no collective with known size and duration to fit a link model to", g.meta.source)
    return comm


def link_fit(g: Graph) -> LinkFit:
    """The link fitted to ``g``'s collectives as measured. Horovod's stalls stay in the latency, every collective's: its
    pipelined link keeps the whole fit as a floor a slower wire hides (``split_at_wire``), and kept on their instances
    beside that wire they put hvd_transformer's third kept round at 200 Mbit/s +22 % (+8 % so)."""
    concurrent = g.meta.comm_lanes > 1
    nbytes, dur = profiled_collectives(g, overlapping=concurrent)
    n = priced_world_size(g)
    fit = fit_link(nbytes, dur, n, concurrent=concurrent)
    if fit.stalls is None or g.meta.horovod is None:
        return fit
    alpha = fit.link.alpha_us + float(fit.stalls.sum()) / len(dur) / (2 * (max(n, 2) - 1))
    return replace(fit, link=replace(fit.link, alpha_us=alpha), stalls=None)


def keep_stalls(g: Graph) -> Graph:
    """``g`` as measured with each stalled collective's time beyond the link fitted to them (``LinkFit.stalls``) moved to
    the gap before its transfer starts (its join's; each rank's ready point where it has none), where no link change or
    re-pricing touches it: the stall stays in its own step. Spread over every collective as latency, wide_deep's one
    91 ms scalar all-reduce (a 235 ms step among 37-49 ms ones, both ranks) put 0.7 ms on each of the 136 in the window:
    the model's mean step matched (+0.1 %), its median was +26 %, and a 200 Mbit/s what-if's median +43 %. Put after the
    transfer (its consumers' gaps) a stall no longer overlapped what the rank ran meanwhile (tests/data/tf/widedeep: the
    mean step +5 %). A graph already priced (``meta.topology``) is returned as is."""
    if g.meta.topology is not None or is_ps_graph(g):
        return g
    try:
        fit = link_fit(g)
    except DagprofError:
        return g
    if fit.stalls is None:
        return g
    gap = g.gap.copy()
    colls = {c.comm: c for c in find_collectives(g)}
    for c, stall in zip(profiled_comm(g, overlapping=g.meta.comm_lanes > 1).tolist(), fit.stalls.tolist()):
        if stall > 0:
            gap[colls[c].head] += stall
    return g.replace(gap=gap)


def fit_topology(g: Graph) -> Topology:
    """A flat topology (one rank per host) whose link reproduces the profiled collectives' transfer times.

    The fitted latency becomes a per-collective overhead, not a per-message wire latency: at
    the profiled size they cost the same, but a profile's latency is mostly software (thread
    hand-off, queueing) that does not grow with the ring's 2(N-1) steps; scaled to thousands of
    ranks as wire latency it would dominate everything. Give network latency with ``set_link``.
    """
    n = priced_world_size(g)
    fit = link_fit(g)
    link = fit.link
    wire = AlphaBeta(0.0, link.beta_us_per_byte, link.gamma_us_per_byte)
    overhead = 2 * (max(n, 2) - 1) * link.alpha_us
    t = Topology(max(n, 1), 1, wire, wire, overhead, profiled_kinds(g, overhead) if fit.weak is None else ())
    return t if g.meta.wire_bytes_per_s is None else split_at_wire(t, g.meta.wire_bytes_per_s, pipelined=g.meta.horovod is not None)


def profiled_kinds(g: Graph, overhead_us: float) -> tuple[tuple[str, AlphaBeta], ...]:
    """Per collective kind of an FSDP profile with more than one, the link on which its collectives cost, beside the
    fit's fixed ``overhead_us``, what they took in all (``Topology.kinds``). One fit to every kind prices gloo's
    all-gather as half an all-reduce of the gathered bytes and its reduce-scatter as a whole one; on the 2-rank
    testbed (1 Gbit/s) that put each all-gather 2-8 % above its measured time and each reduce-scatter 1-4 % below,
    and a link ratio multiplied both (the vendored pair ``tests/data/fsdp/testbed-alternating-*``: 200 Mbit/s +1.0 % ->
    -0.1 %). Only where the one fit tells bandwidth from latency (``LinkFit.weak``): else a kind's share of the
    durations beyond the overhead is noise (the 2-step ``fsdp/reshard`` recording: +2.0 % off its own replay)."""
    if not is_fsdp_graph(g):
        return ()
    mask = priced_comm(g)
    comm = np.array([c.comm for c in find_collectives(g) if mask[c.comm] and g.dur[c.comm] > 0 and g.nbytes[c.comm] > 0], np.int64)
    if not len(comm):
        return ()
    kinds = np.array([kind_of_collective(g.node_name(int(v))) for v in comm])
    if len(np.unique(kinds)) < 2:
        return ()
    n = max(priced_world_size(g), 2)
    wire = 2 * (n - 1) / n * allreduce_equivalent_bytes(g, comm)
    out = []
    for kind in np.unique(kinds).tolist():
        sel = kinds == kind
        transfer = float(g.dur[comm[sel]].sum()) - overhead_us * int(sel.sum())
        if transfer > 0:
            out.append((kind, AlphaBeta(0.0, transfer / float(wire[sel].sum()))))
    return tuple(out)


def split_at_wire(t: Topology, wire_bytes_per_s: float, pipelined: bool = False) -> Topology:
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
    200 Mbit/s (fits 98-101 % of the wire) hvd_sparse_gru's kept rounds came out +70 to +88 % on the median step at 500."""
    wire = 1e6 / wire_bytes_per_s
    if pipelined and t.inter.beta_us_per_byte > wire:
        ab = AlphaBeta(0.0, wire, 0.0)
        alone = replace(t, inter=ab, intra=ab, overhead_us=0.0, kinds=tuple((k, ab) for k, _ in t.kinds))
        return replace(alone, floor=t, floor_wire=alone)

    def split(ab: AlphaBeta) -> AlphaBeta:
        if ab.beta_us_per_byte <= wire:
            return ab
        return AlphaBeta(ab.alpha_us, wire, ab.gamma_us_per_byte + 2 * (ab.beta_us_per_byte - wire))

    return replace(t, inter=split(t.inter), intra=split(t.intra), kinds=tuple((k, split(ab)) for k, ab in t.kinds))


MIN_R2 = 0.5  # below it, message size explains too little of the durations to split latency from bandwidth


def fit_link(nbytes: np.ndarray, dur_us: np.ndarray, workers: int, concurrent: bool = False) -> LinkFit:
    """Latency and bandwidth fitted together to profiled ring all-reduces (absolute residuals, so
    the fit reproduces their total time), with what keeps the two apart.

    Per-collective times are trusted only from a one-at-a-time channel. When collectives
    overlap (gloo's two workers share the link), completion spacing splits a pair's time
    between its two members almost at random, and only the total is meaningful: bandwidth is
    then total time over total bytes, as with a single message size, where latency and
    bandwidth cannot be told apart either; the fit says so (``weak``).
    """
    n = max(workers, 2)
    share = 2 * (n - 1) / n
    sizes = len(np.unique(nbytes))
    total = LinkFit(AlphaBeta(0.0, float(dur_us.sum() / (share * nbytes).sum())), len(nbytes), sizes, None, None)
    if concurrent:
        return replace(total, weak="the collectives overlap on the link, so only their total time is known")
    if sizes < 2 or nbytes.max() < 1.5 * nbytes.min():
        return _fit_one_size(nbytes, dur_us, n, total)
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
    r = dur_us - a @ coef
    mid = float(np.median(r))
    keep = r <= mid + 3 * 1.4826 * float(np.median(np.abs(r - mid)))
    if keep.all() or len(np.unique(nbytes[keep])) < 2:
        return fit_alpha_beta(nbytes, dur_us, n, relative=False), np.zeros(len(nbytes))
    link = fit_alpha_beta(nbytes[keep], dur_us[keep], n, relative=False)
    pred = 2 * (n - 1) * link.alpha_us + 2 * (n - 1) / n * nbytes * link.beta_us_per_byte
    return link, np.where(keep, 0.0, np.maximum(dur_us - pred, 0.0))


def _fit_one_size(nbytes: np.ndarray, dur_us: np.ndarray, n: int, total: LinkFit) -> LinkFit:
    """Collectives of about one size: sizes cannot split latency from bandwidth, but repeats of one size can bound it.
    Their bytes are alike, so what the slower instances took beyond the fastest is not wire time: the link is no slower
    than the fastest instance per byte, and the rest of the mean is per-collective latency (JAX's one fused all-reduce a
    step on a shaped link: 67-81 ms each, which as bandwidth alone scaled 5-8 % too much to a slower link). The total is
    kept; with one instance, or all alike, this is the bandwidth-only fit."""
    share = 2 * (n - 1) / n * nbytes
    ok = share > 0
    if ok.sum() < 2:
        return replace(total, weak="the collectives are all about one size")
    beta = float((dur_us[ok] / share[ok]).min())
    alpha = max(float(dur_us.mean() - beta * share.mean()), 0.0) / (2 * (n - 1))
    return replace(total, link=AlphaBeta(alpha, beta),
                   weak="the collectives are all about one size: bandwidth from the fastest, the slower ones' excess as latency")


# The most bytes a peer may still receive when the first rank out leaves a collective (its send done once its bytes
# sit in the socket): on the namespace testbed an FSDP all-gather's second rank left 1.4-2.2 ms after the first at
# 1 Gbit/s (175-275 kB) and 7.6-9.9 ms at 200 Mbit/s (190-248 kB), whatever the transfer's size. More of a lag than
# that on the profiled link is no wire time to scale: on loopback (a 10 Gbit/s fit on 2 shared cores) DDP's ranks
# lagged 1.3 ms, a descheduled rank, and scaled 50x to 200 Mbit/s added a whole transfer beside the transfer.
SOCKET_BUFFER_BYTES = 256 << 10


def current_topology(g: Graph) -> Topology:
    return g.meta.topology or fit_topology(g)


def current_scheme(g: Graph) -> CollectiveSpec:
    return g.meta.scheme or CollectiveSpec()


def retime_collectives(g: Graph, topo: Topology | None = None, spec: CollectiveSpec | None = None,
                       lags_on: Topology | None = None) -> Graph:
    """Every COMM node priced by the model, and the exit lags at its consumers scaled with the link's time per byte
    (a collective's carried ``exit_lag`` on every rank, else each rank's own; module docstring); the topology's world
    size must be the graph's. ``lags_on``: the link the exit lags were measured on (default: the graph's own); a pass
    that rebuilt the collectives passes its input's, since a fit to collectives it has just inserted would be no link at all."""
    topo = topo or current_topology(g)
    spec = spec or current_scheme(g)
    if is_ps_graph(g):  # a measured parameter-server job: re-place its keys, re-price its messages
        if spec.scheme is not Scheme.PS:
            raise DagprofError(f"this profile is a parameter-server job; scheme {spec} (all-reduce) is not modelled for it, use ps:K")
        return rebuild_ps(g, spec.servers, topo.inter)
    if topo.world_size != priced_world_size(g):
        raise DagprofError(f"topology has {topo.world_size} ranks, the graph's collectives {priced_world_size(g)}")
    if lags_on is None:  # the collectives as measured: their stalls stay where they were (``keep_stalls``)
        g = keep_stalls(g)
    dur, gap = g.dur.copy(), g.gap.copy()
    idx = np.flatnonzero(priced_comm(g))
    kinds = (np.array([kind_of_collective(g.node_name(int(v))) for v in idx], dtype=object)
             if (topo.kinds or topo.link_ratio or _kinds_of(g)) and is_fsdp_graph(g) else np.full(len(idx), "", dtype=object))
    equiv = allreduce_equivalent_bytes(g, idx)
    consumers, lag = exit_lags(g, idx)
    exit_lag = g.exit_lag.copy()
    if topo.world_size < 2:  # a collective of one rank releases no rank after another
        exit_lag[idx] = 0.0
    last = exit_lag[consumers[:, 0]]  # an averaged collective whose last rank out alternated: its last rank's lag
    own = last == 0
    wire = last.copy()
    wire[own] = wire_lags(g, consumers[own, 0], lag[own])
    before = (lags_on or _lags_measured_on(g)) if (wire > 0).any() else None
    for kind in np.unique(kinds).tolist():  # a kind measured on its own (``Topology.kinds``) on its own link
        sel = kinds == kind
        sizes, inverse = np.unique(equiv[sel], return_inverse=True)
        on = topo.for_kind(kind)
        other = np.array([topo.ratio_at(kind, float(m)) for m in sizes])  # another link measured against this one (``link_ratio``)
        if topo.link_delta:  # the calibrated difference added to the profiled price, not its ratio (``Topology.link_delta``)
            priced = np.array([_scaled(allreduce_us(float(m), on, spec), on.overhead_us, topo.kind_factor(kind, float(m)))
                               + topo.delta_at(kind, float(m), topo.world_size) for m in sizes])
        else:
            priced = np.array([_scaled(allreduce_us(float(m), on, spec), on.overhead_us, topo.kind_factor(kind, float(m)) * r) for m, r in zip(sizes, other)])
        if topo.floor is not None:  # the profiled fit's price, less the wire's part a faster wire saves, as the least (``split_at_wire``)
            fit, was = (np.array([allreduce_us(float(m), t.for_kind(kind), spec) for m in sizes]) for t in (topo.floor, topo.floor_wire))
            priced = np.maximum(priced, fit - was + np.minimum(priced, was))
        dur[idx[sel]] = priced[inverse.reshape(-1)]
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
            grow = np.minimum(wire[mine], moved[consumers[mine, 0]]) * (ratio - 1.0)  # a carried lag shrinks on a rank by no more than the wire in its gap
            grow = np.where(own[mine], grow, np.maximum(grow, -exit_lag[consumers[mine, 1]]))
            np.add.at(gap, consumers[mine, 1], grow)
            exit_lag[idx[sel]] += np.minimum(exit_lag[idx[sel]], moved[idx[sel]]) * (per[idx[sel]] - 1.0)
            carried = mine & ~own
            np.add.at(exit_lag, consumers[carried, 1], grow[carried[mine]])  # the wire in its gap now
    devices = [Device(d.name, d.kind, d.rank, 1) if d.kind == DeviceKind.COMM else d for d in g.devices]
    return g.replace(dur=dur, gap=np.maximum(gap, 0.0), exit_lag=exit_lag, devices=devices, meta=g.meta.replace(topology=topo, scheme=spec))


def _scaled(us: float, overhead_us: float, factor: float) -> float:
    """A collective's price with its transfer (not its fixed overhead) scaled by ``factor`` (``Topology.kind_factor``)."""
    return us if factor == 1.0 or us <= overhead_us else overhead_us + (us - overhead_us) * factor


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


def _lags_measured_on(g: Graph) -> Topology | None:
    """The link the graph's exit lags belong to: the one its collectives are priced on now, else the fit to
    them as measured; None where neither exists (a graph whose collectives a pass has just inserted)."""
    try:
        return current_topology(g)
    except DagprofError:
        return None


def _kinds_of(g: Graph) -> bool:
    return bool(g.meta.topology is not None and g.meta.topology.kinds)


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


def ps_bandwidth(fitted: float, wire: float, asked: float) -> float:
    """The bandwidth (B/s) a parameter-server job's messages get at ``asked``, from the ``fitted`` link (``fit_ps_link``)
    of a profile run over a ``wire`` of known rate (all B/s). Fitted faster than the wire, the whole fit scales by the
    rate ratio (a port's burst allowance, bytes crossed outside the timed exchanges). Fitted slower, what limited the
    exchanges was not the wire (busy cores moving the bytes, segments lost and resent), and it streams beside the wire
    rather than after it: a slower wire hides it, and the messages move at the slower of the two; a faster one does not
    lift it. On the namespace testbed under load 13-15 (mx_mlp.py, 2 workers, 1 server) fits of 271-273 Mbit/s at a
    500 Mbit/s tbf (170-420 segments retransmitted) fitted 180-187 at 200 Mbit/s (its payload 191), where the rate
    ratio would have priced them at 109."""
    return asked * fitted / wire if fitted >= wire else min(asked, fitted)


def fit_ps_link(g: Graph, replayer: Callable[[Graph], ReplayResult], iterations: int = 30) -> Graph:
    """``g`` (from ``build_ps_graph``) with the bandwidth at which its push/pull exchanges replay as measured.

    mx.profiler does not say which push carries which key, so single messages cannot be timed. What
    is measured per worker and step is the exchange: from its first push issued to its last pull in
    (``meta.ps.exchange_us``). The rate is the one at which the replayed exchanges last as
    long as the measured ones, on average (replayed exchanges shorten monotonically with the rate,
    so bisection finds it). Only communication is matched: compute, framework gaps and the ops that
    wait for the pulls replay as measured, so the profiled iteration's replay is a check of the
    model, not a fit. The per-message latency (the shortest push/pull round trip) and the server
    work per byte come from the builder's first guess (``graph.build_ps.initial_link``).

    ``replayer`` is ``dagprof.replay.replay`` (passes sit below the replay layer).
    """
    link, servers = g.meta.topology.inter, g.meta.scheme.servers
    target = float(np.mean([span for _, _, span in g.meta.ps.exchange_us]))

    def at(beta: float) -> Graph:
        return rebuild_ps(g, servers, replace(link, beta_us_per_byte=beta))

    def mean_exchange(beta: float) -> float:
        h = at(beta)
        return float(np.mean(list(exchange_us(h, replayer(h).start).values())))

    lo, hi = 0.0, max(link.beta_us_per_byte, 1e-6)
    while mean_exchange(hi) < target and hi < 1e3:
        hi *= 4
    if mean_exchange(lo) >= target:  # even an infinitely fast link exchanges too slowly
        hi = lo
    for _ in range(iterations if hi > lo else 0):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_exchange(mid) < target else (lo, mid)
    out = at(hi)
    out.meta.ps_link_fit = PsLinkFit(float(1e6 / hi) if hi > 0 else float(np.inf), link.alpha_us, link.gamma_us_per_byte, target)
    return out
