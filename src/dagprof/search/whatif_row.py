"""One what-if scenario's answer as a type (``whatif.evaluate`` builds them), so Python callers read fields, not keys.

``to_json`` is the row of ``dagprof whatif --json`` (``whatif.COLUMNS`` defines its columns): the scenario's axis
cells, then the prediction; the optional keys only where they hold something.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..analysis.interval import PredictionInterval
from ..units import MB
from .fsdp_memory import FsdpMemory
from .memory import MemoryBreakdown
from .scenario import Scenario


@dataclass(frozen=True, slots=True)
class WhatifRow:
    scenario: Scenario
    workers: int  # ranks in the scenario (the scenario's own ``workers`` is None where it keeps the profiled ones)
    interval: PredictionInterval  # around the replayed steps' median step: a run's median step is what it is for
    iter_us: float  # the predicted iteration of the slowest rank: the replayed steps' mean, as the profiled run's is measured
    speedup_vs_profiled: float
    speedup_vs_one_worker: float | None  # None: one replica is not modelled (``scenario.fixed_workers``)
    scaling_efficiency: float | None
    vs_measured_pct: float | None  # None: no measured iteration
    seconds: float  # spent evaluating the row
    caveat: str | None = None  # the row rests on a link fit too weak to split latency from bandwidth
    stall_outweighs: str | None = None  # the row changes the step less than a JAX job's per-array stall moves one
    memory_per_rank: dict[int, MemoryBreakdown] | dict[int, FsdpMemory] | None = None  # each rank at its peak (None: not predicted)
    trace: str | None = None  # the predicted timeline written
    note: str | None = None  # what the row changes beyond what its cells say (``whatif.row_note``)

    @property
    def predicted_iter_ms(self) -> float:
        return self.iter_us / 1e3

    @property
    def iters_per_s(self) -> float:
        return 1e6 / self.iter_us

    @property
    def peak_memory_mb(self) -> float | None:
        """The fullest rank's peak, MiB."""
        return None if self.memory_per_rank is None else max(m.total for m in self.memory_per_rank.values()) / MB

    def to_json(self) -> dict:
        row = {**self.scenario.label(), "workers": self.workers,
               "predicted_iter_ms": self.predicted_iter_ms,  # the replayed steps' mean, as the profiled run's iteration is measured
               **self.interval.bounds_dict(),  # the interval around their median step
               "predicted_median_ms": self.interval.point_us / 1e3,  # that median: the interval's point
               "iters_per_s": self.iters_per_s,
               "speedup_vs_profiled": self.speedup_vs_profiled, "speedup_vs_one_worker": self.speedup_vs_one_worker,
               "scaling_efficiency": self.scaling_efficiency, "vs_measured_pct": self.vs_measured_pct, "seconds": self.seconds}
        if self.caveat:
            row["caveat"] = self.caveat
        if self.stall_outweighs:
            row["stall_outweighs"] = self.stall_outweighs
        if self.memory_per_rank is not None:
            row["peak_memory_mb"] = self.peak_memory_mb
            row["memory_per_rank"] = {r: m.to_dict() for r, m in self.memory_per_rank.items()}
        if self.trace:
            row["trace"] = self.trace
        if self.note:
            row["note"] = self.note
        return row
