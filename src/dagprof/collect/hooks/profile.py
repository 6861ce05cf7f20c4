"""``dagprof.profile``: the context manager users put around their training loop."""
from __future__ import annotations

import os
from typing import Any

from ...traces.steps import DEFAULT_STEPS, parse_steps
from .collector import Collector


class profile:  # noqa: N801  (used like torch.profiler.profile)
    """Profile steps ``steps`` (step 0 starts at ``__enter__``; each ``prof.step()`` ends one).

    ``steps``: ``range(10, 20)``, ``(10, 20)`` or ``"10:20"`` = steps 10..19; ``7`` = step 7 alone.

    ``model``: the DDP (or plain) module; by default the first module called inside the
    block is taken (and any DDP modules within it). ``kineto=False`` records hooks only.
    ``record_shapes`` makes Kineto record input shapes (+70..100 % time on small CPU ops).
    ``ranges`` also opens a ``record_function`` range per layer forward, visible in Kineto.
    The files are written when the window ends (training continues) or at exit; each completed
    step of the window is also written at once, so a rank killed mid-window keeps what it completed.
    """

    collector_class = Collector  # collect.hooks.horovod swaps in its own

    def __init__(self, out_dir: str | os.PathLike[str], steps: str | range | tuple[int, int] | int = DEFAULT_STEPS,
                 model: Any = None, kineto: bool = True, record_shapes: bool = False, ranges: bool = False):
        self.out_dir = os.path.abspath(os.fspath(out_dir))
        self.steps = parse_steps(steps)
        self._model = model
        self._options = dict(kineto=kineto, record_shapes=record_shapes, ranges=ranges)
        self._collector: Collector | None = None
        self._handles: list[Any] = []
        self._discovery: Any = None

    def __enter__(self) -> "profile":
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        c = self._collector = self.collector_class(self.out_dir, self.steps, mode="api", **self._options)
        self._handles = [
            register_optimizer_step_pre_hook(c.optimizer_hook(begin=True)),
            register_optimizer_step_post_hook(c.optimizer_hook(begin=False)),
        ]
        if self._model is not None:
            c.attach(self._model)
        else:
            self._discovery = register_module_forward_pre_hook(self._discover)
        c.start()
        return self

    def _discover(self, module: Any, args: Any) -> None:
        """The first module called in the block is the model (the outermost call fires first)."""
        self._discovery.remove()
        self._discovery = None
        self._collector.attach(module)

    def step(self) -> None:
        """Call once at the end of every training step."""
        self._collector.next_step()

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles + ([self._discovery] if self._discovery else []):
            h.remove()
        self._handles, self._discovery = [], None
        self._collector.close(exc[1] if len(exc) > 1 else None)

    @property
    def warnings(self) -> list[str]:
        return list(self._collector.warnings) if self._collector else []
