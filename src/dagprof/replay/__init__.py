"""Discrete-event replay of a ``Graph``: ``replay(graph)`` picks the fastest engine available.

Engines give identical arrays: ``python_engine`` is the reference, ``numba_engine``
the compiled one. ``IncrementalReplayer`` re-simulates only what a local change can affect.
"""
from __future__ import annotations

from ..errors import DagprofError
from ..graph.dag import Graph
from .incremental import IncrementalReplayer
from .numba_engine import load_kernels, replay_numba, validate
from .python_engine import replay_python
from .result import ReplayResult

ENGINES = ("auto", "numba", "python")


def replay(graph: Graph, engine: str = "auto") -> ReplayResult:
    """Simulate ``graph``; ``engine`` is "auto" (numba when usable), "numba" or "python" (same answers)."""
    if engine not in ENGINES:
        raise DagprofError(f"unknown replay engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "numba" or (engine == "auto" and load_kernels() is not None):
        return replay_numba(graph)
    validate(graph)
    return replay_python(graph)


__all__ = ["replay", "replay_python", "replay_numba", "ReplayResult", "IncrementalReplayer", "ENGINES"]
