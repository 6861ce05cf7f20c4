"""Zero-code mode for Horovod: ``dagprof profile -o RUN [--steps A:B] -- horovodrun ... python train.py``.

``autoprofile.install`` (run in every Python process of the job through ``sitecustomize``) calls
``install`` here, handing in its import hook, the run folder and the step window (so this module
needs nothing of the launcher's). It sets ``HOROVOD_TIMELINE=DYNAMIC`` unless the job sets its own (so
``horovodrun`` passes it to every rank and rank 0 can record its timeline during the window), and
``HOROVOD_LOG_LEVEL=trace`` unless the job sets a level (each rank's own response ends, ``horovod_log``), then
waits for ``import horovod.torch`` and wraps ``hvd.DistributedOptimizer``: the optimizer it returns
is attached to a ``HorovodCollector``, the first module called afterwards is taken as the model,
and steps are counted at the end of each outermost ``optimizer.step()``. Files are written when
the window ends, or at exit. Processes that never import ``horovod.torch`` are untouched.
"""
from __future__ import annotations

import atexit
import json
import os
from typing import Any

from .horovod_log import LEVEL_ENV, QUIET_ENV

TIMELINE_ENV = "HOROVOD_TIMELINE"
# what a script calls to exchange gradients by hand (DistributedOptimizer calls them from horovod.torch.mpi_ops, never through these names)
_BY_HAND = ("allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
            "grouped_allreduce_async", "grouped_allreduce_async_", "sparse_allreduce_async", "allgather", "allgather_async",
            "grouped_allgather", "grouped_allgather_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
            "grouped_reducescatter_async", "alltoall", "alltoall_async")


def install(after_import: Any, out: str, steps: str) -> None:
    """Called by ``autoprofile.install`` when a profile was asked for: ``after_import`` is its import hook,
    ``out`` the run folder, ``steps`` the window (``traces.steps`` grammar)."""
    os.environ.setdefault(TIMELINE_ENV, "DYNAMIC")  # read by hvd.init(); inherited by horovodrun's ranks
    if LEVEL_ENV not in os.environ:  # every rank's own response ends (``horovod_log``); its lines kept from the user's output
        os.environ[LEVEL_ENV], os.environ[QUIET_ENV] = "trace", "1"
    after_import("horovod.torch", lambda hvd: _patch(hvd, out, steps))


def _patch(hvd: Any, out: str, steps: str) -> None:
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from ...traces.horovod import OWN_CALLS
    from ...traces.steps import parse_steps
    from .horovod import HorovodCollector

    collector = HorovodCollector(out, parse_steps(steps), kineto=False, mode="launcher")
    original = hvd.DistributedOptimizer

    def DistributedOptimizer(*args: Any, **kwargs: Any) -> Any:  # noqa: N802  (replaces Horovod's factory)
        opt = original(*args, **kwargs)
        collector.attach_optimizer(opt)
        handle = None

        def first_forward(module: Any, inputs: Any) -> None:  # the first module called is the model
            handle.remove()
            collector.attach(module)
            collector.start()

        handle = register_module_forward_pre_hook(first_forward)
        return opt

    def after_step(opt: Any, args: Any, kwargs: Any) -> None:
        collector.update_end()
        if collector.outermost_step_done and collector.step >= 0 and hasattr(opt, "_allreduce_grad_async"):
            collector.next_step()

    hvd.DistributedOptimizer = DistributedOptimizer
    register_optimizer_step_pre_hook(lambda opt, args, kwargs: collector.update_begin())
    register_optimizer_step_post_hook(after_step)
    calls = _count_calls(hvd)

    def at_exit() -> None:
        if collector.step >= 0:
            collector.close()
        elif calls:  # no DistributedOptimizer: say why nothing was profiled (cli.cmd_profile reads it)
            rank = calls.pop("")  # Horovod shuts down at exit before this runs: its rank as the first call saw it
            with open(os.path.join(out, OWN_CALLS.format(rank=rank)), "w") as f:
                json.dump(calls, f)

    atexit.register(at_exit)


def _count_calls(hvd: Any) -> dict[str, int]:
    """Count the script's own calls of Horovod's collectives (by name, as it calls them; ``""``: the rank) in the dict returned."""
    calls: dict[str, int] = {}

    def counted(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.setdefault("", hvd.rank())
            calls[name] = calls.get(name, 0) + 1
            return fn(*args, **kwargs)

        return call

    for name in _BY_HAND:
        if callable(getattr(hvd, name, None)):
            setattr(hvd, name, counted(name, getattr(hvd, name)))
    return calls
