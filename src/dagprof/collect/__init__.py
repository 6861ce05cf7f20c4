"""Collection, in four rooms: ``hooks`` (the profilers per framework), ``deploy`` (the strategy file and ``apply``),
``jobs`` (launching real jobs, the cluster, the demo job), ``measure`` (link, codec and overlap measurements).

The only layer that imports torch, and only when a profile starts (never at import). The framework collectors
docs/frameworks.md names (``dagprof.collect.tf_profile``, ``jax_profile``, ``horovod``, ``mxnet_ps``) resolve lazily here.
"""
import importlib

try:
    from ..traces.steps import parse_steps
    from .hooks.profile import profile
except ImportError:  # a framework's own environment without dagprof's dependencies (MXNet pins numpy<1.24): its
    pass  # standard-library-only collectors (``mxnet_ps``) still import

_COLLECTORS = ("tf_profile", "jax_profile", "horovod", "mxnet_ps")  # modules of collect.hooks


def __getattr__(name: str):
    if name in _COLLECTORS:
        return importlib.import_module(f"{__name__}.hooks.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["profile", "parse_steps", *_COLLECTORS]
