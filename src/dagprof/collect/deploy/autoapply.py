"""Zero-code strategy runs for ``dagprof optimize --verify``: apply a strategy and time the steps.

The launcher's (``jobs.launch``) ``sitecustomize`` calls ``install()`` in every Python process of the job. With
``DAGPROF_STRATEGY`` set, every DistributedDataParallel model gets ``dagprof.apply`` right after
it is built, a module given to the composable ``replicate()`` right after replicate() built its DDP (its lazy init, before
the comm hooks given to the module are registered), and a ``fully_shard``-ed model at its root's first forward, before FSDP's
lazy init (a strategy for another model stops the job there, with one line); a strategy of several roots configures
each other root as the profile attached it (``apply.apply_root``). With
``DAGPROF_TIMES`` set, each rank writes its step times (a step ends when the first optimizer
that ever stepped finishes ``step()``) and the DDP forward calls per step to
``$DAGPROF_TIMES/rank<r>.json`` at exit. A training loop that accumulates gradients asks the
applied plan for its micro-batches: ``dagprof.apply(ddp, path)`` returns the plan already applied.
"""
from __future__ import annotations

import atexit
import os
import time
import warnings
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from ..hooks.steptimes import write_times

ENV_STRATEGY = "DAGPROF_STRATEGY"
ENV_TIMES = "DAGPROF_TIMES"


def install() -> None:
    if ENV_STRATEGY not in os.environ and ENV_TIMES not in os.environ:
        return
    from ..hooks.autoprofile import after_import, after_torch_import

    after_torch_import(lambda: _patch(after_import))  # after autoprofile's, when both run: the profile attaches first, apply keeps its hook


def _patch(after_import: Any) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from ..hooks.autoprofile import on_ddp_built
    from ..hooks.fsdp import on_root_forward
    from .apply import apply, apply_root

    strategy = os.environ.get(ENV_STRATEGY)
    times_dir = os.environ.get(ENV_TIMES)
    clock = _StepClock()
    count = clock.count

    def ddp_built(ddp: Any) -> None:
        if strategy:
            apply(ddp, strategy)  # a mismatch raises here, before the first step
        ddp.register_forward_pre_hook(count)

    def replicate_built(module: Any, replicate_state: Any) -> None:
        """The strategy applied to the module once replicate()'s lazy init built the DDP, before that forward's pre-hook
        registers the user's comm hooks."""
        if strategy:
            apply(module, strategy)

    def count_replicate(replicate_module: Any) -> None:
        """replicate(): its module's forwards are counted from the call (``record_init_args``)."""
        cls = replicate_module._ReplicateState
        record = cls.record_init_args

        @wraps(record)
        def replicate_record(state: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            record(state, module, *args, **kwargs)
            module.register_forward_pre_hook(count)

        cls.record_init_args = replicate_record

    def fsdp_root(root: Any) -> None:
        if strategy:
            apply_root(root, strategy, 0)  # before FSDP's own pre-forward (its lazy init): a mismatch raises here
        count(root, ())  # this forward's module hooks were taken before this one is registered
        root.register_forward_pre_hook(count)

    def other_root(root: Any) -> None:  # a job of several roots: in the order the profile attached them
        clock.roots += 1
        if strategy:
            apply_root(root, strategy, clock.roots)

    on_ddp_built(after_import, ddp_built, replicate_built)
    after_import("torch.distributed._composable.replicate", count_replicate)
    on_root_forward(after_import, fsdp_root, other_root)
    register_optimizer_step_post_hook(clock.after_step)
    if times_dir:
        atexit.register(_write, times_dir, clock)


@dataclass
class _StepClock:
    """A rank's step times (one step: from its first forward to the first optimizer's ``step()`` end) and the forwards
    in each (micro-batches), plus the count of extra FSDP roots seen so far."""

    forwards: int = 0
    last: float | None = None
    steps: list[float] = field(default_factory=list)
    micro: list[int] = field(default_factory=list)
    opt: int | None = None  # id() of the first optimizer that stepped: the one that ends steps
    roots: int = 0

    def count(self, module: Any, inputs: Any) -> None:
        self.forwards += 1
        if self.last is None:
            self.last = time.perf_counter()

    def after_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self.opt is None:
            self.opt = id(opt)
        if self.opt != id(opt):
            return
        now = time.perf_counter()
        if self.last is None:  # no DDP or FSDP forward counted (a script's own data parallelism): step to step
            self.last = now
            return
        self.steps.append(now - self.last)
        self.micro.append(max(self.forwards, 1))
        self.last, self.forwards = now, 0


def _write(folder: str, clock: _StepClock) -> None:
    if not clock.steps:
        return  # not a training rank (the torchrun agent)
    try:
        rank = int(os.environ.get("RANK", "0"))
        write_times(folder, rank, clock.steps, clock.micro)
    except Exception as err:  # noqa: BLE001  (never break the user's job at exit)
        warnings.warn(f"dagprof: could not write step times: {err}", RuntimeWarning, stacklevel=2)
