"""Profile JAX multi-process training into a dagprof run folder.

::

    with dagprof.collect.jax_profile.jax_profile("run", steps=(5, 10)) as prof:
        for step in range(20):
            with prof.step(step):
                params = train_step(params, batch)
                jax.block_until_ready(params)

Each process writes ``run/rank<R>/`` (``jax.profiler`` trace: ``*.xplane.pb``) and
``run/rank<R>.json``; rank and world size are ``jax.process_index()`` / ``jax.process_count()``
unless given. Steps are marked with ``jax.profiler.StepTraceAnnotation("train", step_num=...)``.
JAX's Python tracer stays on: the main thread's wait for the dispatched program
(``block_until_ready``) is only visible through it. JAX is imported only when profiling starts.
"""
from __future__ import annotations

import os
from typing import Any, ContextManager

from ...traces.steps import DEFAULT_STEPS, parse_steps
from .xplane_window import LoopProfile, StepWindow


class jax_profile(LoopProfile):  # noqa: N801
    """Profile steps ``steps``; ``prof.step(i)`` wraps step ``i`` (in the window: a
    ``StepTraceAnnotation`` with its ``step_num``); block on the step's result inside it.

    ``params``: optional pytree of the gradients' shapes (the parameters) for the all-reduce bytes.
    """

    def __init__(self, out_dir: str | os.PathLike[str], steps: range | tuple[int, int] | str | int = DEFAULT_STEPS,
                 rank: int | None = None, world_size: int | None = None, params: Any = None):
        self._args = (out_dir, parse_steps(steps), rank, world_size)
        self._params = params

    def _open(self) -> StepWindow:
        import jax  # noqa: PLC0415

        out_dir, steps, rank, world = self._args
        rank = jax.process_index() if rank is None else rank
        world = jax.process_count() if world is None else world
        window = StepWindow(out_dir, steps, rank, world, "jax", jax.__version__,
                            lambda logdir: jax.profiler.start_trace(logdir), jax.profiler.stop_trace)
        if self._params is not None:
            window.grad_bytes = sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(self._params))
        return window

    def _mark(self, step: int) -> ContextManager[Any]:
        import jax  # noqa: PLC0415

        return jax.profiler.StepTraceAnnotation("train", step_num=step)
