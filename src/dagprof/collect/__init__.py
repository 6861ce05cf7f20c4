"""Collection: torch hooks, the profiler window, the zero-code launcher hook, the demo job.

The only layer that imports torch, and only when a profile starts (never at import).
"""
from .profile import parse_steps, profile

__all__ = ["profile", "parse_steps"]
