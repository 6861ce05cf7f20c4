"""Tensor fusion as bucket boundaries, with compression and partition: one graph, re-priced per plan.

``BucketSlots(g, order)`` replaces the profiled DDP buckets by a *slot* after every parameter in
gradient-ready order: per step, each rank gets an enqueue node right after the backward that
makes that parameter's gradient ready, a join (SYNC) waits for every rank's enqueue, and one
all-reduce node on the group's channel feeds every rank's end-of-backward wait (DDP's finalize;
the optimizer comes after it). A plan (bucket ends, codec, pieces) only sets columns: a slot
where a bucket ends gets the enqueue's measured cost plus the codec's encode time and an
all-reduce priced by the run's link model (``passes.compression``); every other slot costs
nothing and changes nothing. So every candidate is the same graph with other durations, which
``replay.IncrementalReplayer`` re-simulates from the first slot that changed.

``BucketSlots.compact`` drops a realised plan's unused slots (the graph a chosen strategy is reported on).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ..costmodel.codecs import Codec, CodecCosts
from ..costmodel.collectives import allreduce_us
from ..errors import DagprofError
from ..graph.dag import Graph, GraphBuilder
from ..traces.events import CommKind, Kind
from .buckets import chain_lanes, profiled_buckets
from .comm import current_scheme, current_topology, retime_collectives
from .compression import UNMEASURED, BucketCost, Chained, bucket_cost
from .gradients import GradientOrder, ready_nodes

_AFTER = 1e-6  # us: slot i's enqueue is ordered (i+1) * _AFTER after the backward it follows


@dataclass(frozen=True)
class Plan:
    """The bucket-level part of a strategy."""

    ends: tuple[int, ...]  # last parameter (ready-order index) of each bucket
    codec: Codec = field(default_factory=Codec)
    parts: int = 1  # each bucket all-reduced in this many pieces


class BucketSlots:
    """The slotted graph of ``g`` and the node ids of every slot."""

    def __init__(self, g: Graph, order: GradientOrder, costs: CodecCosts | None = None, beside: float = 0.0, chained: Chained = UNMEASURED):
        self.order = order
        self.costs, self.beside, self.chained = costs, beside, chained
        self.topology, self.scheme = current_topology(g), current_scheme(g)
        g = retime_collectives(g, self.topology, self.scheme)  # other collectives priced by the same model
        pb = profiled_buckets(g)
        drop, sinks = pb.drop, pb.sinks
        self.enq_dur, self.enq_gap, self.comm_gap = pb.enq_dur, pb.enq_gap, pb.comm_gap
        channel = int(g.device[pb.comm_ids[0]])
        ready = ready_nodes(g, order)
        steps = sorted({s for s, _ in ready})
        ranks = sorted({r for _, r in ready})
        if any((s, r) not in ready for s in steps for r in ranks):
            raise DagprofError("ranks disagree on the profiled steps' gradients; cannot re-bucket")
        b, remap = GraphBuilder.from_graph(g, ~drop)
        n, P = len(order), len(order)
        self.enq = np.zeros((len(steps), P, len(ranks)), dtype=np.int64)
        self.comm = np.zeros((len(steps), P), dtype=np.int64)
        self.sync = np.zeros((len(steps), P), dtype=np.int64)
        for si, step in enumerate(steps):
            for i in range(n):
                sync = b.add_node(f"sync s{step} p{i}", Kind.SYNC, step=step, bucket=i)
                ready_order = -np.inf
                for ri, r in enumerate(ranks):
                    anchor = int(ready[(step, r)][i])
                    o = float(g.order[anchor]) + _AFTER * (i + 1)
                    e = b.add_node(f"rank{r}.enqueue s{step} p{i}", Kind.COMM_ENQUEUE, rank=r, device=int(g.device[anchor]), order=o,
                                   step=step, bucket=i)
                    b.add_edge(int(remap[anchor]), e)
                    b.add_edge(e, sync)
                    self.enq[si, i, ri] = e
                    ready_order = max(ready_order, o)
                comm = b.add_node(f"allreduce s{step} p{i}", Kind.COMM, device=channel, order=ready_order, step=step, bucket=i,
                                  comm_kind=CommKind.ALL_REDUCE)
                b.add_edge(sync, comm)
                for r in ranks:
                    for v in sinks.get((step, r), ()):
                        b.add_edge(comm, int(remap[v]))
                self.comm[si, i] = comm
                self.sync[si, i] = sync
        chain_lanes(b)
        self.graph = b.build()
        self.remap = remap  # node ids of ``g`` -> ids in ``self.graph`` (-1: a profiled bucket's node, dropped)
        self.steps, self.ranks = steps, ranks
        self._price = lru_cache(maxsize=None)(lambda nb: allreduce_us(nb, self.topology, self.scheme))

    def price(self, nbytes: float) -> float:
        return self._price(float(nbytes))

    def costs_of(self, plan: Plan) -> list[BucketCost]:
        self.order.check_ends(plan.ends)
        if plan.parts < 1:
            raise DagprofError(f"partition count must be >= 1, got {plan.parts}")
        return [bucket_cost(self.order, a, z, plan.codec, plan.parts, self.price, self.costs, self.beside, self.chained)
                for a, z in self.order.bucket_params(plan.ends)]

    def columns(self, plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(slot node ids, dur, gap, nbytes) for ``plan``: the values of every slot node."""
        costs = self.costs_of(plan)
        P = len(self.order)
        enc = np.zeros(P)
        chan = np.zeros(P)
        wire = np.zeros(P, dtype=np.int64)
        used = np.zeros(P, dtype=bool)
        ends = np.asarray(plan.ends, dtype=np.int64)
        used[ends] = True
        enc[ends] = [self.enq_dur + c.encode_us for c in costs]
        chan[ends] = [c.channel_us for c in costs]
        wire[ends] = self.order.bucket_bytes(plan.ends)
        ids = np.concatenate([self.enq.reshape(-1), self.comm.reshape(-1)])
        S, R = len(self.steps), len(self.ranks)
        dur = np.concatenate([np.broadcast_to(enc[None, :, None], (S, P, R)).reshape(-1), np.broadcast_to(chan, (S, P)).reshape(-1)])
        gap = np.concatenate([np.broadcast_to(np.where(used, self.enq_gap, 0.0)[None, :, None], (S, P, R)).reshape(-1),
                              np.broadcast_to(np.where(used, self.comm_gap, 0.0), (S, P)).reshape(-1)])
        nb = np.concatenate([np.zeros(S * P * R, dtype=np.int64), np.broadcast_to(wire, (S, P)).reshape(-1)])
        return ids, dur, gap, nb

    def realize(self, plan: Plan, base: Graph | None = None) -> Graph:
        """The slotted graph (or ``base``, a graph with the same nodes) with ``plan``'s slot columns."""
        g = base if base is not None else self.graph
        ids, dur, gap, nb = self.columns(plan)
        d, gp, n = g.dur.copy(), g.gap.copy(), g.nbytes.copy()
        d[ids], gp[ids], n[ids] = dur, gap, nb
        return g.replace(dur=d, gap=gp, nbytes=n)

    def compact(self, g: Graph, plan: Plan) -> Graph:
        """``g`` (realised from this slot graph) without the slots no bucket uses."""
        unused = np.setdiff1d(np.arange(len(self.order)), np.asarray(plan.ends))
        drop = np.zeros(len(g), dtype=bool)
        drop[self.enq[:, unused, :].reshape(-1)] = True
        drop[self.comm[:, unused].reshape(-1)] = True
        drop[self.sync[:, unused].reshape(-1)] = True
        bucket = g.bucket.copy()  # slot (parameter) index -> bucket number in ready order, as DDP numbers its buckets
        slots = bucket >= 0
        bucket[slots] = np.searchsorted(np.asarray(sorted(plan.ends)), bucket[slots])
        b, _ = GraphBuilder.from_graph(g.replace(bucket=bucket), ~drop)
        chain_lanes(b)  # the lanes ran through the dropped enqueues
        return b.build()
