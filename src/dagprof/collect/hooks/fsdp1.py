"""FSDP1 (``FullyShardedDataParallel``) hooks: every unit's all-gathers, reduce-scatters, all-reduces and reshards.

An FSDP1 unit is one ``FullyShardedDataParallel`` instance (nested by hand or by ``auto_wrap_policy``)
and its ``FlatParamHandle``: one flat parameter gathered and reduced whole. FSDP1's hooks are
module-level functions of ``fsdp._runtime_utils`` bound when FSDP registers them, so during the window
(and only then) this patches what they call by name: ``FlatParamHandle.unshard`` (the all-gather, in
forward, backward or a prefetch), ``FlatParamHandle.reshard`` (a span when it freed the gathered
parameter), ``_runtime_utils._prefetch_handle`` (which unit prefetched: FSDP1's
``BackwardPrefetch.BACKWARD_PRE``/``BACKWARD_POST`` and ``forward_prefetch``) and ``_reduce_grad`` /
``_reduce_grad_no_shard`` (after a unit's backward), and the c10d calls they make (``dist.all_gather``
on CPU, ``all_gather_single`` elsewhere, ``reduce_scatter_single``, ``all_reduce``; before torch 2.13
``all_gather_into_tensor`` and ``reduce_scatter_tensor``). The records are FSDP2's (``collect.hooks.fsdp``), so
the graph, replay and what-ifs read both alike.

The sharding strategy becomes the unit's mesh: ``FULL_SHARD`` and ``SHARD_GRAD_OP`` shard over the
process group (``(n,)``, resharding after forward or not), ``HYBRID_SHARD`` and its ZeRO-2 variant over
``(replicate, shard)``, and ``NO_SHARD`` is ``(n, 1)``: replicated, its gradients all-reduced. FSDP1's root
keeps its parameters after forward (FSDP1 frees them only for non-root units).

Refused in one line at the window's start (profiling stops, training goes on): CPU offload (the copies
to and from the host are not recorded) and a communication hook (its collectives bypass these calls).
Tested with torch 2.13 on CPU (gloo: ``device_id=torch.device("cpu")``; ``sync_module_states`` needs a GPU).
"""
from __future__ import annotations

from functools import partial, wraps
from typing import Any

from ...traces.run_schema import FSDP1_API, FSDP_ROOT, FsdpInfo, FsdpUnit, Rec
from .fsdp import GATHER_NAMES, SCATTER_NAMES, FsdpRecorder, _dtype, _local_bytes, _tensor_arg, own_layers, tensor_collectives

WRAPPED = "_fsdp_wrapped_module"  # FSDP1's attribute for the module it wraps: not part of a layer's name


def clean_name(path: str) -> str:
    """A module or parameter path as the user wrote the model (without FSDP1's wrapper attribute)."""
    return ".".join(p for p in path.split(".") if p != WRAPPED)


def fsdp1_modules(model: Any) -> list[tuple[str, Any]]:
    """(path, module) of every ``FullyShardedDataParallel`` in ``model`` that manages parameters, outermost first."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except ImportError:
        return []
    return [(clean_name(path), m) for path, m in model.named_modules() if isinstance(m, FSDP) and m._handle is not None]


class Fsdp1Recorder(FsdpRecorder):
    """FSDP2's recorder with FSDP1's units: ``groups`` holds each unit's ``FlatParamHandle``."""

    def __init__(self, collector: Any, named: list[tuple[str, Any]]) -> None:
        super().__init__(collector, [m for _, m in named])
        self._fqn = {id(m._handle): path for path, m in named}
        self._state = {id(m._handle): m for _, m in named}

    def _collect_units(self) -> None:
        for m in self.modules:
            self._unit(m._handle)

    def layer_bytes(self) -> tuple[dict[str, int], dict[str, int]]:
        """Unsharded parameter bytes per leaf module, from the flat parameters' original parameters: (those with a
        gradient, those frozen). A flat parameter takes a gradient or not as a whole."""
        grad: dict[str, int] = {}
        frozen: dict[str, int] = {}
        for m in self.modules:
            fp = m._handle.flat_param
            prefix = self._fqn[id(m._handle)]
            out = grad if fp.requires_grad else frozen
            for fqn, numel in zip(fp._fqns, fp._numels):
                path = clean_name(".".join(x for x in (prefix, fqn.rpartition(".")[0]) if x)) or type(m.module).__name__
                out[path] = out.get(path, 0) + numel * fp.element_size()
        return grad, frozen

    def begin(self) -> None:
        import torch.distributed as dist
        import torch.distributed.fsdp._runtime_utils as runtime
        from torch.distributed.fsdp._flat_param import FlatParamHandle
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        from ...errors import DagprofError

        self._collect_units()
        for m in self.modules:
            if m._handle._offload_params:
                raise DagprofError("FSDP1 with CPU offload is not modelled (its host copies are not recorded)")
            if m._comm_hook is not None:
                raise DagprofError("FSDP1 with a communication hook is not modelled (its collectives bypass FSDP's calls)")
        rec = self
        patch = self._patcher()

        def prefetching(state: Any, current: Any, *args: Any, **kwargs: Any) -> int:  # _prefetch_handle(state, current, mode)
            by = rec._guarded("FSDP1 prefetch hook", rec._unit, current) if current is not None else -1
            return -1 if by is None else by

        def all_gather(args: tuple, kwargs: dict) -> tuple[int, str, Any]:  # all_gather(tensor_list, tensor, group): CPU
            out, t = kwargs.get("tensor_list", args[0] if args else []), kwargs.get("tensor", args[1] if len(args) > 1 else None)
            group = kwargs.get("group", args[2] if len(args) > 2 else None)
            return sum(x.numel() * x.element_size() for x in out), _dtype(t.dtype if t is not None else None), group

        def gather_single(args: tuple, kwargs: dict) -> tuple[int, str, Any]:  # all_gather_single(output, input, group)
            nbytes, dtype, group = _tensor_arg("output_tensor", 0)(args, kwargs)
            return nbytes, dtype, group if group is not None else (args[2] if len(args) > 2 else None)

        def pre_backward_hooks(fn: Any) -> Any:
            """FSDP hooks a unit's outputs: its pre-backward (all-gather, prefetch) runs when their gradient arrives.
            Autograd runs a tensor's hooks in the order registered, so the backward of the layer that produced the
            output begins after FSDP's hook (its begin is moved behind it), and the backward of the layer that
            consumes it ends before (that end goes on a hook registered ahead of FSDP's)."""
            @wraps(fn)
            def run(state: Any, module: Any, outputs: Any, *args: Any, **kwargs: Any) -> Any:
                if not rec.c.recording:
                    return fn(state, module, outputs, *args, **kwargs)
                begins = []
                try:
                    for t in _tensors(outputs):
                        whats = rec.c._watch(t)
                        begins.append((t, [w for w in whats if w[0] == Rec.BWD_BEGIN]))
                        whats[:] = [w for w in whats if w[0] != Rec.BWD_BEGIN]
                except Exception as err:  # noqa: BLE001
                    rec.c._fail(err, "FSDP1 pre-backward hooks")
                out = fn(state, module, outputs, *args, **kwargs)
                try:
                    for t, whats in begins:
                        if whats:
                            t.register_hook(partial(rec.c._grad_arrived, whats))
                except Exception as err:  # noqa: BLE001
                    rec.c._fail(err, "FSDP1 pre-backward hooks")
                return out
            return run

        patch(runtime, "_prefetch_handle", lambda fn: self._prefetched_by(fn, prefetching))
        patch(runtime, "_register_pre_backward_hooks", pre_backward_hooks)
        for name in ("_reduce_grad", "_reduce_grad_no_shard"):  # (state, handle)
            patch(runtime, name, lambda fn: self._within(fn, lambda args: (rec._unit(args[1]), "backward", -1)))
        patch(FlatParamHandle, "unshard", lambda fn: self._copy_out(self._within(fn, lambda args: rec._unshard(args[0]))))
        patch(FlatParamHandle, "reshard", lambda fn: self._spanned(fn, Rec.FSDP_RESHARD_BEGIN, _gathered, lambda h: not _gathered(h)))
        patch(dist, "all_gather", lambda fn: self._collective(fn, "all_gather", all_gather))
        for name in tensor_collectives(dist, GATHER_NAMES):
            patch(dist, name, lambda fn: self._collective(fn, "all_gather", gather_single))
        for name in tensor_collectives(dist, SCATTER_NAMES):
            patch(dist, name, lambda fn: self._collective(fn, "reduce_scatter", _tensor_arg("input", 1)))
        patch(dist, "all_reduce", lambda fn: self._collective(fn, "all_reduce", _tensor_arg("tensor", 0)))
        self._size_functional()
        if self._opt_hook is None:
            self._opt_hook = register_optimizer_step_pre_hook(self._before_step)

    def _copy_out(self, unshard: Any) -> Any:
        """After an all-gather, ``FlatParamHandle.unshard`` points the parameters at the gathered flat parameter:
        a copy-out span from the collective's return to the method's (so the wait on the transfer ends there). Its
        storage is named to the saved-tensor hook (``SavedActivations.gathered``), as FSDP2's: a layer that saves its weight
        saves a view of the whole unit's gathered flat parameter, which was counted as that layer's activations
        (``bench/fsdp_fresh/fsdp1_sgo_frozen.py``: each block's first norm 0.76 MiB, the head's 2.03 MiB, on top of the
        units' gathered parameters)."""
        rec = self

        @wraps(unshard)
        def run(handle: Any, *args: Any, **kwargs: Any) -> Any:
            n = len(rec.c.records)
            out = unshard(handle, *args, **kwargs)
            if rec.c.recording:
                rec._guarded("FSDP1 unshard hook", lambda: rec.c.saved.gathered([handle.flat_param]))
            if rec.c.recording and len(rec.c.records) > n and rec.c.records[-1][0] == Rec.FSDP_COLL_END:
                rec._guarded("FSDP1 unshard hook", rec._span, handle, Rec.FSDP_COPY_OUT_BEGIN, rec.c.records[-1][3], lambda h: True)
            return out
        return run

    def _param_shards(self) -> list[Any]:
        return [m._handle.flat_param for m in self.modules]

    def end(self) -> None:
        super().end()  # the flat parameters may still be gathered (no reshard after the last forward): count the shards
        self._memory["param_shard_bytes"] = sum(_local_bytes(m._handle.flat_param._local_shard) for m in self.modules)

    def release(self) -> None:
        super().release()
        self.groups, self._state = [], {}  # the handles and FSDP modules: the profile is written, keep nothing of the model

    def info(self, layers: list[str]) -> FsdpInfo:
        units = []
        fqns = [self._fqn[id(h)] for h in self.groups]
        for h, fqn in zip(self.groups, fqns):
            state, fp = self._state[id(h)], h.flat_param
            strategy = h._sharding_strategy.name.lstrip("_")  # FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD | HYBRID_SHARD_ZERO2
            if strategy == "NO_SHARD":
                mesh, dims = [h.process_group.size(), 1], ["replicate", "shard"]
            elif strategy.startswith("HYBRID"):
                mesh, dims = [state._inter_node_pg.size(), h.world_size], ["replicate", "shard"]
            else:
                mesh, dims = [h.world_size], []
            units.append(FsdpUnit(
                name=fqn or FSDP_ROOT, layers=own_layers(fqn, [f for f in fqns if f != fqn], layers),
                params=[clean_name(".".join(x for x in (fqn, p) if x)) for p in fp._fqns],
                numel=fp._unpadded_unsharded_size.numel(), shard_bytes=_local_bytes(fp._local_shard),
                orig_dtype=_dtype(h._orig_param_dtype), param_dtype=_dtype(h._fwd_bwd_param_dtype), reduce_dtype=_dtype(h._reduce_dtype),
                reshard_after_forward=strategy in ("FULL_SHARD", "HYBRID_SHARD") and not state._is_root,
                mesh=mesh, mesh_dims=dims, strategy=strategy,
                backward_prefetch=state.backward_prefetch.name if state.backward_prefetch is not None else "",
                forward_prefetch=bool(state.forward_prefetch),
                frozen_numel=0 if fp.requires_grad else fp._unpadded_unsharded_size.numel(),
                frozen_tensors=0 if fp.requires_grad else len(fp._fqns),
            ))
        return FsdpInfo(api=FSDP1_API, units=units, collectives=self.collectives, layer_saved_gathered_bytes=dict(self.c.saved.most_gathered),
                        **self._memory)


def _tensors(outputs: Any) -> list[Any]:
    """The tensors in a module's output that require gradients (FSDP1 hooks those)."""
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.requires_grad]


def _gathered(handle: Any) -> bool:
    """The handle's full flat parameter is allocated (what ``reshard(free=True)`` frees)."""
    return handle.uses_sharded_strategy and not handle.needs_unshard()


def install_launcher(collector: Any, after_import: Any) -> None:
    """Zero-code mode: the first ``FullyShardedDataParallel`` built arms a global forward pre-hook; the first
    module called that holds FSDP1 units (the outermost: the root) is attached and starts step 0."""
    state: list[Any] = []

    def first_forward(module: Any, inputs: Any) -> None:
        if state[0] is not None and fsdp1_modules(module):
            state[0].remove()
            state[0] = None
            collector.attach(module)
            collector.start()

    def patch(module: Any) -> None:
        cls = module.FullyShardedDataParallel
        original = cls.__init__

        @wraps(original)
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if not state:
                from torch.nn.modules.module import register_module_forward_pre_hook

                state.append(register_module_forward_pre_hook(first_forward))

        cls.__init__ = init

    after_import("torch.distributed.fsdp", patch)
