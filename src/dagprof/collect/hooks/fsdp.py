"""FSDP2 (``fully_shard``) hooks: every unit's all-gathers, reduce-scatters, HSDP all-reduces and reshards.

FSDP2 exposes no callback API, so during the window (and only then) this patches, at class level,
the methods of ``FSDPParamGroup`` (one per FSDP unit) that FSDP's module hooks call (its own hooks
are bound methods, registered before dagprof attaches), ``_prefetch_unshard`` included, and the three
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

from ...traces.run_schema import FsdpCollective, FsdpInfo, FsdpUnit, Rec

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
        self._last = -1  # the unit whose pre-forward/pre-backward ran last (FSDP prefetches from there)
        self._prefetching: list[int] = []  # inside FSDP's _prefetch_unshard: the unit that prefetches
        self._optimizers: dict[int, Any] = {}
        self._memory: dict[str, int] = {}
        self._grad_bytes = 0  # gradient shards as the optimizer step starts (the most in the window)
        self._opt_hook: Any = None

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
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._collect_units()
        rec = self

        def patch(owner: Any, name: str, make: Any) -> None:
            original = owner.__dict__[name]
            fn = original.__func__ if isinstance(original, staticmethod) else original
            new = make(fn)
            setattr(owner, name, staticmethod(new) if isinstance(original, staticmethod) else new)
            self.c._restore.append(lambda: setattr(owner, name, original))

        def in_pass(fn: Any) -> Any:
            """A unit's pre-forward/pre-backward: the unit that prefetches whatever is unsharded next for another."""
            @wraps(fn)
            def run(group: Any, *args: Any, **kwargs: Any) -> Any:
                if rec.c.recording:
                    rec._last = rec._unit(group)
                return fn(group, *args, **kwargs)
            return run

        def prefetch(fn: Any) -> Any:
            @wraps(fn)
            def run(target: Any, *args: Any, **kwargs: Any) -> Any:
                if not rec.c.recording:
                    return fn(target, *args, **kwargs)
                rec._prefetching.append(rec._last)
                try:
                    return fn(target, *args, **kwargs)
                finally:
                    rec._prefetching.pop()
            return run

        def unshard(fn: Any) -> Any:
            @wraps(fn)
            def run(group: Any, *args: Any, **kwargs: Any) -> Any:
                if not rec.c.recording:
                    return fn(group, *args, **kwargs)
                u = rec._unit(group)
                phase = "forward" if group._training_state.name == "FORWARD" else "backward"
                by = rec._prefetching[-1] if rec._prefetching else -1
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
        patch(FSDPParamGroup, "_prefetch_unshard", prefetch)
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
        if self._opt_hook is None:  # removed by ``release``: the window may end inside these hooks' loop (launcher mode)
            self._opt_hook = register_optimizer_step_pre_hook(self._before_step)

    def _record(self, kind: str, tensor: Any, group: Any, dist: Any) -> int:
        unit, phase, by = self._context[-1]
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        nbytes = tensor.numel() * tensor.element_size() if tensor is not None else 0
        dtype = str(tensor.dtype).removeprefix("torch.") if tensor is not None else ""
        self.collectives.append(FsdpCollective(kind=kind, unit=unit, phase=phase, prefetched_by=by, nbytes=nbytes, dtype=dtype,
                                                group=",".join(map(str, ranks)), issued_ns=time.time_ns()))
        return len(self.collectives) - 1

    def _before_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not self.c.recording:
            return
        try:
            self._optimizers.setdefault(id(opt), opt)
            grads = sum(_local_bytes(fp.sharded_param.grad) for g in self.groups for fp in g.fsdp_params)
            self._grad_bytes = max(self._grad_bytes, grads)
        except Exception as err:  # noqa: BLE001
            self.c._fail(err, "FSDP optimizer hook")

    # ------------------------------------------------------------ output
    def end(self) -> None:
        """Sharded memory per rank as the window ends (the model is still referenced)."""
        self._collect_units()
        params = sum(_local_bytes(fp.sharded_param) for g in self.groups for fp in g.fsdp_params)
        state = sum(_local_bytes(v) for opt in self._optimizers.values() for s in opt.state.values() for v in s.values()
                    if getattr(v, "dim", lambda: 0)() > 0)
        self._memory = {"param_shard_bytes": params, "grad_shard_bytes": self._grad_bytes, "optim_state_bytes": state}

    def release(self) -> None:
        """Drop the optimizer hook and every reference to the model (the collector is done)."""
        if self._opt_hook is not None:
            self._opt_hook.remove()
            self._opt_hook = None
        self._optimizers.clear()
        self.modules = []

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
                shard_bytes=sum(_local_bytes(fp.sharded_param) for fp in fps),
                orig_dtype=_dtype(g._orig_dtype), param_dtype=_dtype((fps[0].param_dtype or fps[0].orig_dtype) if fps else None),
                reduce_dtype=_dtype(g._reduce_dtype or g._orig_dtype), reshard_after_forward=bool(g._reshard_after_forward),
                mesh=list(mesh.shape), mesh_dims=list(mesh.mesh_dim_names or ()),
            ))
        return FsdpInfo(units=units, collectives=self.collectives, **self._memory)


def _local_bytes(t: Any) -> int:
    """Bytes this rank holds of a tensor or DTensor (0 for None)."""
    if t is None:
        return 0
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def _dtype(d: Any) -> str:
    return str(d).removeprefix("torch.") if d is not None else ""


def install_launcher(collector: Any, after_import: Any) -> None:
    """Zero-code mode: the root FSDP module's first forward attaches the collector and starts step 0."""

    def attach(root: Any) -> None:
        collector.attach(root)
        collector.start()

    on_root_forward(after_import, attach)


def on_root_forward(after_import: Any, fn: Any) -> None:
    """Call ``fn(root)`` at the first forward of a ``fully_shard``-ed module (the outermost: the root), once:
    the first ``fully_shard`` call arms a global forward pre-hook, removed when it fires."""

    def armed(fully_shard: Any) -> Any:
        @wraps(fully_shard)
        def run(*args: Any, **kwargs: Any) -> Any:
            out = fully_shard(*args, **kwargs)
            if not state:
                from torch.nn.modules.module import register_module_forward_pre_hook

                state.append(register_module_forward_pre_hook(first_forward))
            return out
        return run

    state: list[Any] = []

    def first_forward(module: Any, inputs: Any) -> None:
        if fsdp_modules(module) and state[0] is not None:
            state[0].remove()
            state[0] = None
            fn(module)

    def patch(module: Any) -> None:
        if hasattr(module, "fully_shard"):
            module.fully_shard = armed(module.fully_shard)

    after_import("torch.distributed.fsdp", patch)
