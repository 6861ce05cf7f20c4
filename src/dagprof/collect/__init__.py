"""Collection: torch hooks, the profiler window, the zero-code launcher hook, the demo job.

The only layer that imports torch, and only when a profile starts (never at import).
"""
try:
    from ..traces.steps import parse_steps
    from .profile import profile
except ImportError:  # a framework's own environment without dagprof's dependencies (MXNet pins numpy<1.24): its
    pass  # standard-library-only collectors (``mxnet_ps``) still import

__all__ = ["profile", "parse_steps"]
