"""Tensor fusion search: which DDP bucket size makes the iteration shortest.

Every candidate, the current layout included, is priced by the same link model fitted to the
run's own collectives, so the comparison is apples to apples; the measured-layout replay is
reported beside it to show how much the model itself moves the figure.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..analysis import job_iteration_us
from ..errors import DagprofError
from ..graph.dag import Graph
from ..passes import set_buckets
from ..traces.events import Kind

DEFAULT_CAPS_MB = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0, 64.0)


@dataclass
class BucketChoice:
    cap_mb: float | None  # None: the profiled layout
    buckets_per_step: int
    predicted_iter_us: float


@dataclass
class BucketSearch:
    measured_layout_replay_us: float  # the profiled buckets with their measured transfer times
    current: BucketChoice  # the profiled buckets, priced by the model
    candidates: list[BucketChoice]

    @property
    def best(self) -> BucketChoice:
        return min(self.candidates + [self.current], key=lambda c: c.predicted_iter_us)

    @property
    def predicted_gain_pct(self) -> float:
        return 100.0 * (self.current.predicted_iter_us - self.best.predicted_iter_us) / self.current.predicted_iter_us

    def to_dict(self) -> dict:
        row = lambda c: {"bucket_cap_mb": c.cap_mb, "buckets_per_step": c.buckets_per_step, "predicted_iter_ms": c.predicted_iter_us / 1e3}  # noqa: E731
        return {
            "measured_layout_replay_ms": self.measured_layout_replay_us / 1e3,
            "current": row(self.current),
            "candidates": [row(c) for c in self.candidates],
            "best": row(self.best),
            "predicted_gain_pct": self.predicted_gain_pct,
        }


def search_bucket_sizes(g: Graph, caps_mb: tuple[float, ...] = DEFAULT_CAPS_MB) -> BucketSearch:
    if not caps_mb:
        raise DagprofError("no bucket sizes to try")
    base = job_iteration_us(g)
    current = _evaluate(set_buckets(g, None), None)
    cands = [_evaluate(set_buckets(g, cap * 2**20), cap) for cap in caps_mb]
    return BucketSearch(base, current, cands)


def _evaluate(g: Graph, cap_mb: float | None) -> BucketChoice:
    steps = max(len(g.meta.get("steps", [])), 1)
    comms = int(((g.kind == Kind.COMM) & (g.rank < 0)).sum())
    return BucketChoice(cap_mb, comms // steps, job_iteration_us(g))
