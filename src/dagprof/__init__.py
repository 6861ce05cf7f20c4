"""dagprof: why distributed training is slower than linear, and what to change.

The Python API mirrors the CLI. Names resolve lazily, so ``import dagprof`` does no work and
never imports torch (only ``dagprof.profile`` does, when a profile starts).
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    "profile": "dagprof.collect.hooks.profile",  # context manager for a training loop
    "apply": "dagprof.collect.deploy.apply",  # deploy a strategy file on a DDP model
    "load": "dagprof.traces.load",  # any input -> Run
    "build_graph": "dagprof.graph.build",  # Run -> Graph
    "replay": "dagprof.replay",  # Graph -> ReplayResult
    "analyze": "dagprof.analysis",  # Graph (+ result) -> Analysis
    "open_run": "dagprof.pipeline",  # path -> graph, analysis, findings
    "diff_profiles": "dagprof.analysis.diff",  # two open_run results -> what changed and why
    "DagprofError": "dagprof.errors",
}


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'dagprof' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


__all__ = list(_API)
