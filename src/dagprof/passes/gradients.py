"""The model's gradients in DDP's ready order: what a bucket layout is made of.

DDP rebuilds its buckets after the first iteration in the order gradients became ready, and
the profile records that layout (parameter names, shapes, bucket bytes). Concatenated, the
buckets give every parameter in ready order; each belongs to a layer (its leaf module) whose
BACKWARD node in the graph says when the gradient is ready. A bucket layout is then a list of
bucket ends: indices into that parameter order (a bucket holds the parameters after the previous
end up to and including its own).

A parameter owned by a non-leaf module (nn.MultiheadAttention's in_proj_weight) has no layer
of its own; it is timed with its nearest neighbour in ready order, which runs in the same module.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..errors import DagprofError
from ..graph.dag import Graph
from ..traces.buckets import BucketLayout
from ..traces.events import Kind


@dataclass(frozen=True)
class GradientOrder:
    params: tuple[str, ...]  # every parameter with a gradient, in ready order
    shapes: tuple[tuple[int, ...] | None, ...]  # None when the profile did not record it
    nbytes: np.ndarray  # per parameter: gradient bytes
    layer: np.ndarray  # per parameter: graph layer id whose backward makes it ready
    element_size: int = 4
    profiled_ends: tuple[int, ...] = ()  # the profiled layout's buckets

    def __len__(self) -> int:
        return len(self.params)

    @property
    def total_bytes(self) -> int:
        return int(self.nbytes.sum())

    def check_ends(self, ends: tuple[int, ...]) -> None:
        if not ends or ends[-1] != len(self) - 1 or any(b <= a for a, b in zip(ends[:-1], ends[1:])) or ends[0] < 0:
            raise DagprofError(f"bucket ends must rise strictly and end at parameter {len(self) - 1}, got {list(ends)[:8]}")

    def bucket_bytes(self, ends: tuple[int, ...]) -> np.ndarray:
        cum = np.cumsum(self.nbytes)
        e = np.asarray(ends, dtype=np.int64)
        return np.diff(np.r_[0, cum[e]]).astype(np.int64)

    def bucket_params(self, ends: tuple[int, ...]) -> list[tuple[int, int]]:
        """(first, last) parameter index of each bucket."""
        starts = [0] + [e + 1 for e in ends[:-1]]
        return list(zip(starts, ends))

    def layout_from_caps(self, cap_bytes: float, first_bytes: float | None = None) -> tuple[int, ...]:
        """DDP's own assignment (``compute_bucket_assignment_by_size``): a bucket closes at the first
        parameter that brings it to its limit; the first bucket's limit may be smaller."""
        caps = [cap_bytes] if first_bytes is None else [first_bytes, cap_bytes]
        return self.layout_from_limits(caps)

    def layout_from_limits(self, limits: list[float]) -> tuple[int, ...]:
        """Bucket k closes at limit ``limits[min(k, len - 1)]`` (DDP's ``bucket_cap_mb_list``)."""
        ends, acc = [], 0.0
        for i, nb in enumerate(self.nbytes.tolist()):
            acc += nb
            if acc >= limits[min(len(ends), len(limits) - 1)]:
                ends.append(i)
                acc = 0.0
        if not ends or ends[-1] != len(self) - 1:
            ends.append(len(self) - 1)
        return tuple(ends)

    def boundaries(self) -> np.ndarray:
        """Parameter indices after which a bucket may end: the last parameter of each layer run."""
        last = np.r_[self.layer[1:] != self.layer[:-1], True]
        return np.flatnonzero(last)


def gradient_order(g: Graph, layout: BucketLayout, never_rebuilt: bool = False) -> GradientOrder:
    """From a profiled DDP bucket layout (``RankTrace.buckets``: the collector's last) and the graph's layers.

    ``never_rebuilt``: DDP with ``find_unused_parameters=True`` (``RankMeta.find_unused``) keeps the buckets it built at
    wrapping, each in registration order and the buckets reversed; each bucket's parameters are reversed here, so the
    order runs against registration throughout (DDP's guess at ready order), and every layout of runs of it is one
    ``dagprof.apply`` can have DDP build (``collect.deploy.apply._unbuildable``)."""
    if not layout:
        raise DagprofError("the profile has no DDP bucket layout (was the model wrapped in DistributedDataParallel?)")
    layout = sorted(layout, key=lambda b: b.index)
    turn = (lambda xs: xs[::-1]) if never_rebuilt else (lambda xs: xs)
    params = [p for b in layout for p in turn(b.params)]
    shapes = tuple(s for b in layout for s in turn(b.shapes or (None,) * len(b.params)))
    total_numel = sum(math.prod(s) for s in shapes if s is not None)
    total_bytes = sum(b.nbytes for b in layout)
    known = all(s is not None for s in shapes) and total_numel > 0
    element = max(1, round(total_bytes / total_numel)) if known else 4
    layer_id = {name: i for i, name in enumerate(g.layers)}
    layer = np.array([layer_id.get(p.rpartition(".")[0], -1) for p in params], dtype=np.int64)
    if (layer < 0).all():
        raise DagprofError("no parameter of the DDP buckets belongs to a profiled layer; cannot time the gradients" + unhooked(g))
    for i in range(len(layer)):  # orphans take the layer before them in ready order (else the one after)
        if layer[i] < 0:
            layer[i] = layer[i - 1] if i > 0 and layer[i - 1] >= 0 else layer[np.flatnonzero(layer >= 0)[0]]
    if known:
        nbytes = np.array([math.prod(s) * element for s in shapes], dtype=np.int64)
    else:  # an older profile: each bucket's bytes over its parameters, by layer gradient bytes when known
        nbytes = np.concatenate([turn(_spread(b.nbytes, len(b.params))) for b in layout])
    ends = tuple(int(x) - 1 for x in np.cumsum([len(b.params) for b in layout]))
    return GradientOrder(tuple(params), shapes, nbytes, layer, element, ends)


def _spread(total: int, n: int) -> np.ndarray:
    base = np.full(n, total // n, dtype=np.int64)
    base[: total - base.sum()] += 1
    return base


def last_pass_start(g: Graph, backward: list[int]) -> float:
    """The order from which a step's last backward pass runs, given one rank's BACKWARD nodes of the step; -inf when
    the step holds one pass.

    Gradient accumulation (``no_sync`` on all but the last of P micro-batches) runs each layer's backward P times a step,
    and DDP fills its buckets in the last pass only. P is the most common count of backward nodes per layer (a layer
    applied twice in one pass has more; one whose input needs no gradient may have fewer)."""
    by_layer = _by_layer(g, backward)
    passes = _passes(by_layer)
    if passes <= 1:
        return -math.inf
    return min(float(g.order[max(vs, key=lambda v: g.order[v])]) for vs in by_layer.values() if len(vs) == passes)


def backward_passes(g: Graph) -> int:
    """The most backward passes any rank's step of ``g`` runs (``last_pass_start``'s P): more than 1 where the job
    accumulates gradients itself."""
    bw = np.flatnonzero((g.kind == Kind.BACKWARD) & (g.rank >= 0) & (g.step >= 0) & (g.layer >= 0))
    per_step: dict[tuple[int, int], list[int]] = defaultdict(list)
    for v in bw.tolist():
        per_step[(int(g.step[v]), int(g.rank[v]))].append(v)
    return max((_passes(_by_layer(g, vs)) for vs in per_step.values()), default=1)


def _by_layer(g: Graph, backward: list[int]) -> dict[int, list[int]]:
    by_layer: dict[int, list[int]] = defaultdict(list)
    for v in backward:
        by_layer[int(g.layer[v])].append(v)
    return by_layer


def _passes(by_layer: dict[int, list[int]]) -> int:
    return int(np.argmax(np.bincount([len(vs) for vs in by_layer.values()]))) if by_layer else 1


def ready_nodes(g: Graph, order: GradientOrder) -> dict[tuple[int, int], np.ndarray]:
    """(step, rank) -> per parameter, the BACKWARD node after which its gradient is ready.

    That is the layer's backward that accumulates the gradient (the one carrying gradient
    bytes; else its last), and never earlier than the parameters before it in ready order
    (DDP fills and launches buckets in that order). Under gradient accumulation only the step's
    last backward pass counts (``last_pass_start``): the earlier ones fill no bucket.
    """
    bw = np.flatnonzero((g.kind == Kind.BACKWARD) & (g.rank >= 0) & (g.step >= 0) & (g.layer >= 0))
    bw = bw[np.argsort(g.order[bw], kind="stable")]
    per_step: dict[tuple[int, int], list[int]] = defaultdict(list)
    for v in bw.tolist():
        per_step[(int(g.step[v]), int(g.rank[v]))].append(v)
    start = {key: last_pass_start(g, vs) for key, vs in per_step.items()}
    bw = np.asarray([v for v in bw.tolist() if g.order[v] >= start[(int(g.step[v]), int(g.rank[v]))]], dtype=np.int64)
    last: dict[tuple[int, int, int], int] = {}
    grad: dict[tuple[int, int, int], int] = {}
    for v in bw.tolist():
        key = (int(g.step[v]), int(g.rank[v]), int(g.layer[v]))
        last[key] = v
        if g.nbytes[v] > 0:
            grad[key] = v
    out = {}
    for step in sorted({k[0] for k in last}):
        for rank in sorted({k[1] for k in last if k[0] == step}):
            nodes = np.full(len(order), -1, dtype=np.int64)
            for i, lay in enumerate(order.layer.tolist()):
                nodes[i] = grad.get((step, rank, lay), last.get((step, rank, lay), -1))
            if (nodes < 0).all():
                continue
            for i in range(len(nodes)):  # a layer missing in this step: ready with the one before
                if nodes[i] < 0:
                    nodes[i] = nodes[i - 1] if i > 0 else nodes[np.flatnonzero(nodes >= 0)[0]]
            pos = g.order[nodes]
            run = np.maximum.accumulate(pos)
            idx = np.arange(len(nodes))
            latest = np.maximum.accumulate(np.where(pos == run, idx, 0))  # index of the running maximum
            out[(step, rank)] = nodes[latest]
    if not out:
        raise DagprofError("the graph has no BACKWARD node of a layer with gradients; cannot re-bucket")
    return out


def unhooked(g: Graph) -> str:
    """Why a DDP profile holds no layer, where it holds none: a model under torch.compile runs its modules inside its
    graphs, without their hooks (``traces.run_rank`` warns per rank)."""
    if np.isin(g.kind, [Kind.FORWARD, Kind.BACKWARD]).any():
        return ""
    return " (no layer's forward or backward is in this profile: a model under torch.compile runs its modules without their hooks)"

