"""One facade over focused analysers (as HolisticTraceAnalysis does, without the DataFrames)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..graph.dag import Graph
from ..replay import ReplayResult, replay
from ..traces.events import Kind
from .breakdown import RankBreakdown, breakdown, iteration_times, job_iteration_us
from .critical_path import CriticalPath, critical_path, skew_note
from .interval import StepStatistic, measured_step_us
from .parallelism import DimComm, comm_by_dim, parallelism_dict, ps_compression


@dataclass
class Analysis:
    graph: Graph
    result: ReplayResult
    predicted_iter_us: dict[int, float]
    measured_iter_us: dict[int, float]
    ranks: list[RankBreakdown]
    path: CriticalPath
    comm_dims: list[DimComm]

    @property
    def steps(self) -> int:
        return max(len(self.graph.meta.steps), 1)

    @property
    def predicted_us(self) -> float:
        """The job's iteration time: the slowest rank's (``job_iteration_us``)."""
        return self.graph.meta.job_of(list(self.predicted_iter_us.values()))

    @property
    def measured_us(self) -> float | None:
        """The measured iteration the replay's ``predicted_us`` is held against: the slowest rank's mean step."""
        return measured_step_us(self.graph, StepStatistic.MEAN)[0]

    @property
    def error_pct(self) -> float | None:
        m = self.measured_us
        return None if not m else 100.0 * (self.predicted_us - m) / m

    def to_dict(self) -> dict:
        return {
            "measured_iter_ms": None if self.measured_us is None else self.measured_us / 1e3,
            "predicted_iter_ms": self.predicted_us / 1e3,
            "error_pct": self.error_pct,
            "per_rank": [
                {
                    **b.to_dict(per=self.steps),
                    "measured_iter_ms": self.measured_iter_us.get(b.rank, float("nan")) / 1e3,
                    "predicted_iter_ms": self.predicted_iter_us.get(b.rank, float("nan")) / 1e3,
                }
                for b in self.ranks
            ],
            "critical_path_per_iter": self.path.to_dict(per=self.steps),
            "communication_by_dim": [d.to_dict(per=self.steps) for d in self.comm_dims],
            "parallelism": parallelism_dict(self.graph),
            "ps_compression": ps_compression(self.graph, self.result),
            "steps": self.graph.meta.steps,
            "nodes": len(self.graph),
            "edges": self.graph.num_edges,
            "engine": self.result.engine,
        }


def analyze(graph: Graph, result: ReplayResult | None = None) -> Analysis:
    result = result if result is not None else replay(graph)
    marks, predicted = result.start[graph.kind == Kind.STEP], iteration_times(graph, result)
    path = critical_path(graph, result, span_us=float(marks.max()) if len(marks) else None)  # to the window's end
    note = skew_note(graph, result, path, graph.meta.job_of(list(predicted.values()))) if predicted else None
    return Analysis(
        graph=graph,
        result=result,
        predicted_iter_us=predicted,
        measured_iter_us={int(k): float(v) for k, v in graph.meta.measured_iter_us.items()},
        ranks=breakdown(graph, result),
        path=dataclasses.replace(path, note="; ".join(n for n in (path.note, note) if n)) if note else path,
        comm_dims=comm_by_dim(graph, result),
    )


__all__ = ["Analysis", "analyze", "breakdown", "critical_path", "iteration_times", "job_iteration_us", "CriticalPath", "RankBreakdown"]
