"""Discrete-event replay of a ``Graph``: ``replay(graph)`` picks the fastest engine available.

- ``replay(g, engine="auto"|"numba"|"python") -> ReplayResult``: engines give identical
  start/end/gate arrays; ``python_engine`` is the reference, ``numba_engine`` the compiled
  one (about 0.3 s per million ops on one core, JIT cached on disk). Bad graphs (cycles,
  indices out of range, capacity < 1, negative or non-finite times) raise ``DagprofError``.
- ``IncrementalReplayer(g)`` then ``.update(new_g, changed) -> ReplayResult``: the same
  answer as ``replay(new_g)``, re-simulating only from the first time the change can matter.
- Ranks that behave alike are simulated once: ``graph.symmetry.fold_ranks`` / ``expand``.
Graphs are treated as immutable: change them with ``Graph.replace`` or a builder, never in place.
"""
from __future__ import annotations

from ..errors import DagprofError
from ..graph.dag import Graph
from ..graph.replay_result import ReplayResult
from .incremental import IncrementalReplayer
from .numba_engine import load_kernels, replay_numba
from .python_engine import replay_python

ENGINES = ("auto", "numba", "python")


def replay(graph: Graph, engine: str = "auto") -> ReplayResult:
    """Simulate ``graph``; ``engine`` is "auto" (numba when usable), "numba" or "python" (same answers)."""
    if engine not in ENGINES:
        raise DagprofError(f"unknown replay engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "numba" or (engine == "auto" and load_kernels() is not None):
        return replay_numba(graph)
    graph.lint()
    return replay_python(graph)


__all__ = ["replay", "replay_python", "replay_numba", "ReplayResult", "IncrementalReplayer", "ENGINES"]
