"""Collection: torch hooks, the profiler window, the zero-code launcher hook, the demo job.

The only layer that imports torch, and only when a profile starts (never at import).
"""
from ..traces.steps import parse_steps
from .profile import profile

__all__ = ["profile", "parse_steps"]
