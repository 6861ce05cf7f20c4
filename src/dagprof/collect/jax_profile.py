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

import contextlib
import os
from typing import Any, Iterator

from .xplane_window import StepWindow, parse_window


class jax_profile:  # noqa: N801
    """Profile steps ``steps``; ``prof.step(i)`` wraps step ``i`` (block on its result inside it).

    ``params``: optional pytree of the gradients' shapes (the parameters) for the all-reduce bytes.
    """

    def __init__(self, out_dir: str | os.PathLike[str], steps: range | tuple[int, int] | str | int = range(5, 10),
                 rank: int | None = None, world_size: int | None = None, params: Any = None):
        self._args = (out_dir, parse_window(steps), rank, world_size)
        self._params = params
        self.window: StepWindow | None = None

    def __enter__(self) -> "jax_profile":
        import jax  # noqa: PLC0415

        out_dir, steps, rank, world = self._args
        rank = jax.process_index() if rank is None else rank
        world = jax.process_count() if world is None else world
        self.window = StepWindow(out_dir, steps, rank, world, "jax", jax.__version__,
                                 lambda logdir: jax.profiler.start_trace(logdir), jax.profiler.stop_trace)
        if self._params is not None:
            self.window.grad_bytes = sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(self._params))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.window is not None:
            self.window.close()

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        import jax  # noqa: PLC0415

        w = self.window
        if w is None:
            raise RuntimeError("use jax_profile as a context manager: with jax_profile(...) as prof")
        w.step_begin(step)
        if w.active:
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                yield
        else:
            yield
        w.step_end(step)
