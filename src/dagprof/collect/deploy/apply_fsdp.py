"""``dagprof.apply(fsdp_model, strategy)``: deploy an FSDP2 strategy on a model that ``fully_shard`` wraps.

Call it on every rank after the last ``fully_shard`` (the root's) and before the first forward:

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    dagprof.apply(model, "strategy.json")

What torch 2.13 lets change after wrapping, and how each choice is set:
- ``reshard_after_forward`` per unit: ``FSDPModule.set_reshard_after_forward(flag, recurse=False)``, public
  and documented for exactly this (the root's too: FSDP otherwise keeps the root gathered);
- the reduce dtype: FSDP2 has no public setter after wrapping (``MixedPrecisionPolicy`` is a ``fully_shard``
  argument). ``apply`` replaces each unit's policy in its parameter group (``FSDPParamGroup.mp_policy``)
  and lets FSDP derive its dtypes again (``_init_mp_dtypes``, which FSDP's lazy init runs before the first
  forward anyway): internal API, checked on torch 2.13. The documented way is at wrap time:
  ``fully_shard(module, **fully_shard_kwargs(strategy, name))`` gives each unit its ``reshard_after_forward``
  and ``mp_policy``;
- prefetch depth and unit grouping are not in FSDP strategies (prefetch: measured to change nothing on gloo/CPU,
  ``passes.fsdp.PREFETCH_ON_GLOO``; grouping is which modules ``fully_shard`` wraps, a wrap-time choice that
  ``optimize`` advises beside the strategy).

A job of several ``fully_shard`` roots (a GAN's generator and discriminator, an actor-critic) takes every root,
in the order the profiled job first ran them forward (the order ``dagprof profile`` attached them):
``dagprof.apply([generator, discriminator], "strategy.json")``. Root ``k``'s units are named as the profile named
them (``FSDP<Class>k.`` before each module path after the first root; ``collector.root_prefix``), so a list in
another order is refused by name or size. ``optimize --verify`` applies each root as the job reaches it
(``deploy.autoapply``).

A strategy for another model (a unit it names is not an FSDP unit here, one of the model's units is not
in it, or a unit's parameter count differs) is refused in one line before anything changes.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ...errors import DagprofError
from ...traces.run_schema import FSDP_ROOT
from .strategy import FsdpPlan, Strategy

REDUCE_DTYPES = ("float32", "bfloat16", "float16", "float64")


def fsdp_units(model: Any, root: int = 0) -> dict[str, Any]:
    """The ``fully_shard``-ed modules under ``model`` by unit name (module path; ``<root>`` for ``model``); ``model``
    the ``root``-th root of a job of several (k > 0): the names the profile gave its units (the module docstring)."""
    from torch.distributed.fsdp import FSDPModule

    prefix = f"{type(model).__name__}{root}" if root else ""
    # a root with no parameters of its own (an nn.Sequential of sharded blocks) has no group: no unit, as the profile has none
    named = {name: m for name, m in model.named_modules() if isinstance(m, FSDPModule) and _groups(m)}
    if not root:
        return {name or FSDP_ROOT: m for name, m in named.items()}
    return {f"{prefix}.{name}" if name else prefix: m for name, m in named.items()}


def validate_fsdp(model: Any, s: Strategy, source: str | None = None, root: int = 0) -> dict[str, Any]:
    """Refuse, in one line, an FSDP strategy that does not fit ``model`` (its ``root``-th root); its units by name otherwise."""
    from torch.distributed.fsdp import FSDPModule

    plan: FsdpPlan = s.fsdp.of_root(root)
    if not isinstance(model, FSDPModule):
        raise DagprofError(f"this is an FSDP strategy: dagprof.apply needs the fully_shard-ed root module, got {type(model).__name__}", source)
    if not plan.units:
        raise DagprofError(f"the strategy configures {s.fsdp.roots} fully_shard roots; this job has a root {root + 1} "
                           f"({type(model).__name__}) it does not name", source)
    here = fsdp_units(model, root)
    numel = {name: sum(fp._orig_size.numel() for g in _groups(m) for fp in g.fsdp_params) for name, m in here.items()}
    why = plan.mismatch(numel, "a fully_shard-ed module here", "here")
    if why:
        raise DagprofError(f"strategy does not match the model: {why}", source)
    if plan.reduce_dtype is not None and plan.reduce_dtype not in REDUCE_DTYPES:
        raise DagprofError(f"invalid strategy: reduce dtype {plan.reduce_dtype!r}, expected one of {', '.join(REDUCE_DTYPES)}", source)
    return here


def apply_fsdp(model: Any, s: Strategy, source: str | None = None, root: int = 0) -> None:
    """Set each unit's ``reshard_after_forward`` and, when the plan has one, its reduce dtype (see the module docstring);
    ``root``: ``model`` is that root of a job of several, configured with its own units' part of the plan."""
    import torch

    here = validate_fsdp(model, s, source, root)
    for u in s.fsdp.of_root(root).units:
        if u.reshard_after_forward and all(g._reshard_after_forward for g in _groups(here[u.name])):
            continue  # resharding already, perhaps to fewer ranks (reshard_after_forward=N, which optimize keeps): left as it is
        here[u.name].set_reshard_after_forward(u.reshard_after_forward, recurse=False)
    if s.fsdp.reduce_dtype is not None:
        dtype = getattr(torch, s.fsdp.reduce_dtype)
        for m in here.values():
            for g in _groups(m):
                g.mp_policy = dataclasses.replace(g.mp_policy, reduce_dtype=dtype)
                g._init_mp_dtypes()


def fully_shard_kwargs(strategy: Strategy, name: str) -> dict[str, Any]:
    """The documented wrap-time form of an FSDP strategy for unit ``name`` (a module path, ``<root>`` for the root):
    ``fully_shard(module, **fully_shard_kwargs(s, path))``. Pass your own mixed-precision ``param_dtype`` yourself."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    plan = strategy.fsdp
    if plan is None:
        raise DagprofError("this is a DDP strategy; fully_shard_kwargs needs an FSDP one")
    unit = next((u for u in plan.units if u.name == name), None)
    if unit is None:
        raise DagprofError(f"the strategy has no FSDP unit {name!r} (it has {', '.join(u.name for u in plan.units)})")
    out: dict[str, Any] = {"reshard_after_forward": unit.reshard_after_forward}
    if plan.reduce_dtype is not None:
        out["mp_policy"] = MixedPrecisionPolicy(reduce_dtype=getattr(torch, plan.reduce_dtype))
    return out


def _groups(module: Any) -> list[Any]:
    state = module._get_fsdp_state()
    return list(getattr(state, "_fsdp_param_groups", None) or [])
