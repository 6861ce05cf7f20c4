"""Zero-code-change mode: ``dagprof profile -o RUN -- torchrun ... train.py``.

The launcher (``jobs.launch``) puts ``jobs/bootstrap/`` on PYTHONPATH; its ``sitecustomize`` calls ``install()``
in every Python process of the job. ``install`` waits for ``import torch`` (a meta-path
finder; processes that never import torch are untouched), then wraps
``DistributedDataParallel.__init__`` (attach hooks, step 0 starts at its first forward), the composable
``replicate()``'s lazy init (``_ReplicateState.init``, run by its forward pre-hook: the DDP it builds over a flat
``ParameterList`` is attached with the module it reduces, and step 0 starts in that first forward),
``fully_shard`` (``collect.hooks.fsdp.install_launcher``: the same at the root FSDP module's first forward)
and ``FullyShardedDataParallel.__init__`` (FSDP1, ``collect.hooks.fsdp1.install_launcher``: likewise)
and counts steps with global optimizer hooks (a step ends when the first optimizer that
ever stepped finishes ``step()``). Files are written when the window ends, or at exit; each
completed step of the window also at once, so a rank killed mid-window keeps those.

Horovod jobs (``horovodrun ...``) are handled by ``horovod_auto``. What it cannot see: models not
wrapped in DistributedDataParallel, replicate(), FSDP (``fully_shard`` or ``FullyShardedDataParallel``) or Horovod's DistributedOptimizer (DeepSpeed, plain
single-process training), data loading that is not a torch DataLoader (it
is part of ``other:pre-forward``), steps of a second optimizer (only the first optimizer
that steps counts steps), a comm hook the script registered on DDP before dagprof attached
(none is possible: dagprof attaches inside ``DDP.__init__``), the Kineto trace of a process
killed by a signal before the window ended (its hook records of completed steps are kept).
"""
from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import sys
import warnings
from functools import wraps
from typing import Any

from ...traces.steps import DEFAULT_STEPS, parse_steps
from .collector import Collector
from .exit_gc import release_at_exit
from .fsdp import install_launcher as install_fsdp_launcher
from .fsdp1 import install_launcher as install_fsdp1_launcher

ENV_OUT = "DAGPROF_OUT"
ENV_STEPS = "DAGPROF_STEPS"
ENV_KINETO = "DAGPROF_KINETO"


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs its callbacks right after the module ``name`` finished executing (once)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.callbacks: list[Any] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            for fn in self.callbacks:
                try:
                    fn(module)
                except Exception as err:  # noqa: BLE001  (never break the user's job)
                    warnings.warn(f"dagprof: zero-code hooks not installed: {type(err).__name__}: {err}", RuntimeWarning, stacklevel=2)

        spec.loader.exec_module = exec_then_patch
        return spec


def after_import(name: str, fn: Any) -> None:
    """Call ``fn(module)`` once the module ``name`` is imported (now, if it already is); callbacks run in the order given."""
    if name in sys.modules:
        fn(sys.modules[name])
        return
    finder = next((f for f in sys.meta_path if isinstance(f, AfterImport) and f.name == name), None)
    if finder is None:
        finder = AfterImport(name)
        sys.meta_path.insert(0, finder)
    finder.callbacks.append(fn)


def after_torch_import(fn: Any) -> None:
    """Call ``fn()`` once torch is imported (now, if it already is)."""
    after_import("torch", lambda module: fn())


def on_ddp_built(after_import: Any, on_ddp: Any, on_replicate: Any) -> None:
    """Call ``on_ddp(ddp)`` after each DistributedDataParallel is built, and ``on_replicate(module, state)`` once the composable
    ``replicate()``'s lazy init (``_ReplicateState.init``, run by its forward pre-hook at the module's first forward) built
    its DDP: that DDP holds a flat ``ParameterList`` that never runs forward, so it is the module's and ``on_ddp`` skips it."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    original_init = DDP.__init__
    replicating: list[bool] = []  # inside replicate()'s lazy init

    @wraps(original_init)
    def ddp_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if not replicating:
            on_ddp(self)

    def patch_replicate(replicate_module: Any) -> None:
        cls = replicate_module._ReplicateState
        init = cls.init

        @wraps(init)
        def replicate_init(state: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            fresh = not state.has_initialized
            replicating.append(True)
            try:
                init(state, module, *args, **kwargs)
            finally:
                replicating.pop()
            if fresh:
                on_replicate(module, state)

        cls.init = replicate_init

    DDP.__init__ = ddp_init
    after_import("torch.distributed._composable.replicate", patch_replicate)


def install() -> None:
    if ENV_OUT not in os.environ:
        return
    from .horovod_auto import install as install_horovod

    # a Horovod job: its optimizer, not DDP, is what dagprof attaches to
    install_horovod(after_import, os.environ[ENV_OUT], os.environ.get(ENV_STEPS) or DEFAULT_STEPS)
    after_torch_import(_patch)


def _patch() -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    collector = Collector(
        os.environ[ENV_OUT], parse_steps(os.environ.get(ENV_STEPS) or DEFAULT_STEPS),
        kineto=os.environ.get(ENV_KINETO, "1") == "1", mode="launcher",
    )
    stepping: list[int] = []  # id of the optimizer whose steps are counted

    def first_forward(model: Any) -> None:
        """Step 0 begins at the model's first forward."""
        if under_compile():  # torch.compile(DDP(model)): DDP's forward is traced or runs in a frame Dynamo compiles
            collector.mark_compiled()
        collector.start()
        model.register_forward_pre_hook(next_forward)

    def next_forward(module: Any, inputs: Any) -> None:
        # ZeRO's overlapped step ends each step inside backward, and no optimizer step follows: the next training forward begins the next
        if collector.steps_by_forward and torch.is_grad_enabled():
            collector.next_step()

    def ddp_built(ddp: Any) -> None:
        collector.attach(ddp)

        def first(module: Any, inputs: Any) -> None:
            handle.remove()
            first_forward(ddp)

        handle = ddp.register_forward_pre_hook(first)

    def replicate_built(module: Any, state: Any) -> None:
        """replicate()'s DDP is attached with the module whose leaves are the layers; step 0 begins in this first forward."""
        collector.attach(module, reducer=state._ddp)
        first_forward(module)

    def after_step(opt: Any, args: Any, kwargs: Any) -> None:
        try:
            if not collector.update_end(opt):  # an optimizer stepped inside another (ZeRO's local one): the outer's step counts
                return
        except Exception as err:  # noqa: BLE001  (profiling stops, the user's step goes on)
            collector._fail(err, "optimizer hook")
            return
        if not stepping:
            stepping.append(id(opt))
        if stepping[0] == id(opt) and collector.step >= 0:
            collector.next_step()

    on_ddp_built(after_import, ddp_built, replicate_built)  # DDP, and the composable replicate(): DDP's reducer
    install_fsdp_launcher(collector, after_import)  # FSDP2: the root module's first forward starts step 0
    install_fsdp1_launcher(collector, after_import)  # FSDP1 (FullyShardedDataParallel): the same
    register_optimizer_step_pre_hook(collector.optimizer_hook(begin=True))
    register_optimizer_step_post_hook(after_step)
    atexit.register(_close, collector)


def under_compile() -> bool:
    """Whether the caller runs under torch.compile: inside Dynamo's trace, or in a frame its callback compiles (False
    where torch cannot say: an old torch, whose hooks the collector then installs as before)."""
    try:
        import torch
        from torch._C._dynamo.eval_frame import get_eval_frame_callback

        return bool(torch.compiler.is_compiling() or get_eval_frame_callback() not in (None, False))
    except Exception:  # noqa: BLE001  (called in the user's forward: never raises)
        return False


def _close(collector: Collector) -> None:
    if collector.step >= 0:  # this process trained a DDP model (the torchrun agent never does)
        collector.close(getattr(sys, "last_value", None))  # set when an uncaught exception ended the script
        release_at_exit()  # the model it released, before finalization (exit_gc: the collect it registers now comes too late)
