"""FSDP2 (``fully_shard``) hooks: every unit's all-gathers, reduce-scatters, HSDP all-reduces and reshards.

FSDP2 exposes no callback API, so during the window (and only then) this patches, at class level,
the methods of ``FSDPParamGroup`` (one per FSDP unit) that FSDP's own hooks call, and the three
c10d functions its collectives go through (``dist.all_gather_single``, ``dist.reduce_scatter_single``,
``dist.all_reduce``). The collector undoes every patch when the window ends. Each collective call
gets a typed ``FsdpCollective`` row (unit, kind, pass, who prefetched it, bytes, dtype, group) and two
records ``FSDP_COLL_BEGIN``/``END`` on the main thread; the copy-out after an all-gather and each
reshard get their spans. With gloo the collectives FSDP issues on CPU block the calling thread, so
the call span holds the transfer (Kineto shows it on gloo's worker thread). Sharded memory per rank
(parameters, gradients, optimizer state) is read at the window's end.

Tested with torch 2.13 (``torch.distributed.fsdp._fully_shard``); an FSDP whose internals moved
raises inside a guarded hook, which disables profiling with one warning, never the training.
"""
from __future__ import annotations

import time
from functools import wraps
from typing import Any

from ..traces.run_schema import FsdpCollective, FsdpInfo, FsdpUnit, Rec

ROOT_UNIT = "<root>"  # the unit of the root module (FSDP names it "")


def fsdp_modules(model: Any) -> list[Any]:
    """The ``fully_shard``-ed modules in ``model`` (empty when torch has no FSDP2 or none is used)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


class FsdpRecorder:
    """One per collector: the FSDP units of the attached model and what they did in the window."""

    def __init__(self, collector: Any, modules: list[Any]) -> None:
        self.c = collector
        self.modules = modules
        self.groups: list[Any] = []  # FSDPParamGroup per unit, in the order units are first seen
        self._unit_of: dict[int, int] = {}
        self.collectives: list[FsdpCollective] = []
        self._context: list[tuple[int, str, int]] = []  # (unit, pass, prefetched by) of the FSDP call running
        self._running: list[int] = []  # units whose pre-forward/pre-backward hook runs (who prefetches)
        self._optimizers: dict[int, Any] = {}
        self._memory: dict[str, int] = {}

    # ------------------------------------------------------------ units
    def _unit(self, group: Any) -> int:
        u = self._unit_of.get(id(group))
        if u is None:
            u = self._unit_of[id(group)] = len(self.groups)
            self.groups.append(group)
        return u

    def _collect_units(self) -> None:
        for m in self.modules:
            state = m._get_fsdp_state()
            for g in getattr(state, "_fsdp_param_groups", None) or []:
                self._unit(g)

    # ------------------------------------------------------------ window
    def begin(self) -> None:
        """Patch FSDP for the window; the collector's ``_restore`` undoes it."""
        import torch.distributed as dist
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._collect_units()
        rec = self

        def patch(owner: Any, name: str, make: Any) -> None:
            original = owner.__dict__[name]
            fn = original.__func__ if isinstance(original, staticmethod) else original
            new = make(fn)
            setattr(owner, name, staticmethod(new) if isinstance(original, staticmethod) else new)
            self.c._restore.append(lambda: setattr(owner, name, original))

        def in_pass(fn: Any) -> Any:
            @wraps(fn)
            def run(group: Any, *args: Any, **kwargs: Any) -> Any:
                if not rec.c.recording:
                    return fn(group, *args, **kwargs)
                rec._running.append(rec._unit(group))
                try:
                    return fn(group, *args, **kwargs)
                finally:
                    rec._running.pop()
            return run

        def unshard(fn: Any) -> Any:
            @wraps(fn)
            def run(group: Any, *args: Any, **kwargs: Any) -> Any:
                if not rec.c.recording:
                    return fn(group, *args, **kwargs)
                u = rec._unit(group)
                phase = "forward" if group._training_state.name == "FORWARD" else "backward"
                by = rec._running[-1] if rec._running and rec._running[-1] != u else -1
                rec._context.append((u, phase, by))
                try:
                    return fn(group, *args, **kwargs)
                finally:
                    rec._context.pop()
            return run

        def spanned(fn: Any, begin: Rec, before: Any, after: Any) -> Any:
            """Records [begin, begin + 1] around ``fn`` only when it did something (``before`` and ``after`` hold)."""
            @wraps(fn)
            def run(group: Any, *args: Any, **kwargs: Any) -> Any:
                if not rec.c.recording:
                    return fn(group, *args, **kwargs)
                was, t0 = before(group), time.time_ns()
                out = fn(group, *args, **kwargs)
                if was and after(group):
                    u, phase = rec._unit(group), 0 if group._training_state.name == "FORWARD" else 1
                    rec.c.records.append((int(begin), u, phase, t0, 0))
                    rec.c.records.append((int(begin) + 1, u, phase, time.time_ns(), 0))
                return out
            return run

        def post_backward(fn: Any) -> Any:
            @wraps(fn)
            def run(group: Any, *args: Any, **kwargs: Any) -> Any:
                if not rec.c.recording:
                    return fn(group, *args, **kwargs)
                rec._context.append((rec._unit(group), "backward", -1))
                try:
                    return fn(group, *args, **kwargs)
                finally:
                    rec._context.pop()
            return run

        def collective(fn: Any, kind: str, tensor_arg: str, tensor_pos: int) -> Any:
            @wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                if not rec.c.recording or not rec._context:
                    return fn(*args, **kwargs)
                t = kwargs.get(tensor_arg, args[tensor_pos] if len(args) > tensor_pos else None)
                index = rec._record(kind, t, kwargs.get("group"), dist)
                rec.c._mark(Rec.FSDP_COLL_BEGIN, index, rec.collectives[index].unit)
                out = fn(*args, **kwargs)
                rec.c._mark(Rec.FSDP_COLL_END, index, rec.collectives[index].unit)
                return out
            return run

        patch(FSDPParamGroup, "pre_forward", in_pass)
        patch(FSDPParamGroup, "pre_backward", in_pass)
        patch(FSDPParamGroup, "unshard", unshard)
        patch(FSDPParamGroup, "post_backward", post_backward)
        patch(FSDPParamGroup, "wait_for_unshard",
              lambda fn: spanned(fn, Rec.FSDP_COPY_OUT_BEGIN, lambda g: g._all_gather_result is not None, lambda g: True))
        patch(FSDPParamGroup, "reshard", lambda fn: spanned(fn, Rec.FSDP_RESHARD_BEGIN, lambda g: g.is_unsharded,
                                                                  lambda g: not g.is_unsharded))
        # all_gather_single(output, input, group): the gathered (full) bytes; reduce_scatter_single(output,
        # input, ...) and all_reduce(tensor, ...): the bytes of the tensor reduced
        patch(dist, "all_gather_single", lambda fn: collective(fn, "all_gather", "output_tensor", 0))
        patch(dist, "reduce_scatter_single", lambda fn: collective(fn, "reduce_scatter", "input", 1))
        patch(dist, "all_reduce", lambda fn: collective(fn, "all_reduce", "tensor", 0))
        handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: self._optimizers.setdefault(id(opt), opt))
        self.c._restore.append(handle.remove)

    def _record(self, kind: str, tensor: Any, group: Any, dist: Any) -> int:
        unit, phase, by = self._context[-1]
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        nbytes = tensor.numel() * tensor.element_size() if tensor is not None else 0
        dtype = str(tensor.dtype).removeprefix("torch.") if tensor is not None else ""
        self.collectives.append(FsdpCollective(kind, unit, phase, by, nbytes, dtype, ",".join(map(str, ranks)), time.time_ns()))
        return len(self.collectives) - 1

    # ------------------------------------------------------------ output
    def end(self) -> None:
        """Sharded memory per rank as the window ends (the model is still referenced)."""
        self._collect_units()
        params = grads = 0
        for g in self.groups:
            for fp in g.fsdp_params:
                p = fp.sharded_param
                local = p.to_local() if hasattr(p, "to_local") else p
                params += local.numel() * local.element_size()
                if p.grad is not None:
                    lg = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                    grads += lg.numel() * lg.element_size()
        state = 0
        for opt in self._optimizers.values():
            for s in opt.state.values():
                for v in s.values():
                    v = v.to_local() if hasattr(v, "to_local") else v
                    if hasattr(v, "numel") and v.dim() > 0:
                        state += v.numel() * v.element_size()
        self._memory = {"param_shard_bytes": params, "grad_shard_bytes": grads, "optim_state_bytes": state}

    def info(self, layers: list[str]) -> FsdpInfo:
        units = []
        for g in self.groups:
            fqn = g._module_fqn or ROOT_UNIT
            prefix = "" if fqn == ROOT_UNIT else fqn + "."
            inner = [m for g2 in self.groups if g2 is not g for m in (g2._module_fqn,) if m and m.startswith(prefix)]
            own = [i for i, name in enumerate(layers)
                   if (not prefix or name.startswith(prefix)) and not any(name.startswith(m + ".") for m in inner)]
            fps = g.fsdp_params
            mesh = g.mesh_info.mesh
            units.append(FsdpUnit(
                name=fqn, layers=own, params=[fp._param_fqn or "?" for fp in fps],
                numel=sum(fp._orig_size.numel() for fp in fps),
                shard_bytes=sum(fp.sharded_param.to_local().numel() * fp.sharded_param.element_size() for fp in fps),
                orig_dtype=_dtype(g._orig_dtype), param_dtype=_dtype((fps[0].param_dtype or fps[0].orig_dtype) if fps else None),
                reduce_dtype=_dtype(g._reduce_dtype or g._orig_dtype), reshard_after_forward=bool(g._reshard_after_forward),
                mesh=list(mesh.shape), mesh_dims=list(mesh.mesh_dim_names or ()),
            ))
        return FsdpInfo(units=units, collectives=self.collectives, **self._memory)


def _dtype(d: Any) -> str:
    return str(d).removeprefix("torch.") if d is not None else ""
