"""FSDP2 (``fully_shard``) hooks: every unit's all-gathers, reduce-scatters, HSDP all-reduces and reshards.

FSDP2 exposes no callback API, so during the window (and only then) this patches, at class level,
the methods of ``FSDPParamGroup`` (one per FSDP unit) that FSDP's module hooks call (its own hooks
are bound methods, registered before dagprof attaches), ``_prefetch_unshard`` included, and the three
c10d functions its collectives go through (``dist.all_gather_single``, ``dist.reduce_scatter_single``,
``dist.all_reduce``; before torch 2.13 ``all_gather_into_tensor`` and ``reduce_scatter_tensor``). The collector
undoes every patch when the window ends. Each collective call gets a typed ``FsdpCollective`` row (unit, kind,
pass, who prefetched it, bytes, dtype, group) and two records ``FSDP_COLL_BEGIN``/``END`` on the main thread; the
copy-out after an all-gather and each reshard get their spans. With gloo the collectives FSDP issues on CPU block the calling thread, so
the call span holds the transfer (Kineto shows it on gloo's worker thread). The job's own ``DTensor.full_tensor()`` calls (a
state_dict gathered for a save) and blocking c10d calls outside FSDP's (``JOB_CALLS``: DCP's saves) are recorded the same
way, as collectives of no unit. Sharded memory per rank
(parameters, gradients, optimizer state) is read at the window's end; each unshard names the unit's gathered parameters
to the saved-tensor hook, which counts those a layer saves apart from its activations; each unit's forward (pre- to
post-forward) is named to it too, which counts what is saved between leaf modules meanwhile per unit.

Tested with torch 2.13 (``torch.distributed.fsdp._fully_shard``) on CPU and 2.11 on a GPU (``bench/gpu``); an FSDP
whose internals moved raises inside a guarded hook, which disables profiling with one warning, never the training.
"""
from __future__ import annotations

import time
from functools import wraps
from typing import Any

from ...traces.comm_kind import CommKind
from ...traces.run_schema import FSDP_ROOT, FULL_TENSOR, JOB_CALL, FsdpCollective, FsdpInfo, FsdpUnit, Rec
from .own_collectives import patch_functional

# The c10d functions FSDP's all-gathers and reduce-scatters go through: torch 2.13 calls ``*_single``, earlier torch the
# ``*_into_tensor`` / ``*_tensor`` names (2.13 keeps them, deprecated, calling the new ones inside c10d, where a patch of
# ``torch.distributed``'s attribute does not reach: patching every name present counts each call once). Same arguments.
GATHER_NAMES = ("all_gather_single", "all_gather_into_tensor")
SCATTER_NAMES = ("reduce_scatter_single", "reduce_scatter_tensor")
# The blocking c10d calls a job makes itself, outside FSDP's: function -> the argument holding this rank's tensor (None: a
# barrier). DCP's save and get_model_state_dict run their object collectives through them (``all_gather_object``: two
# all_gathers; ``gather_object``: an all_gather and a gather; ``broadcast_object_list``, ``scatter_object_list``: broadcasts
# and scatters): 9 a save of ``bench/fsdp_fresh/unet_dcp.py``, host time before they were recorded. Patched in
# ``torch.distributed`` (the job's calls) and in ``distributed_c10d`` (the object collectives' calls inside it), each
# wrapping the same function, so a call is recorded once. Not ``own_collectives.OWN_CALLS``, though both patch blocking
# ``torch.distributed`` calls (the collector runs one recorder or the other, never both: FSDP's job, or a DDP one with
# Kineto): those are a DDP model's calls inside its ops, recorded as bytes per rank that the reader matches to Kineto's
# transfers; these are an FSDP job's calls outside FSDP's, each recorded as a whole collective that the graph joins across
# ranks, a barrier too (no bytes, a join). So the names differ: ``*_single`` / ``*_into_tensor`` are FSDP's own
# (``GATHER_NAMES``), ``all_reduce`` is patched apart (FSDP's HSDP all-reduce goes through it), and an all-to-all of the
# job's own is not recorded (host time).
JOB_CALLS = {"all_gather": "tensor", "gather": "tensor", "scatter": "tensor", "broadcast": "tensor", "barrier": None}


def tensor_collectives(dist: Any, names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` this torch's ``torch.distributed`` defines."""
    return [name for name in names if name in dist.__dict__]


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
        self._group_ranks: dict[int, tuple[Any, str]] = {}  # id(process group) -> (the group, its ranks joined): fixed per group
        self._timing = 0  # inside a collective this recorder times (``_timed``): its functional collectives are that one's

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
        from torch.distributed.tensor import DTensor
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._collect_units()
        rec = self
        patch = self._patcher()

        def in_pass(fn: Any) -> Any:
            """A unit's pre-forward/pre-backward: the unit that prefetches whatever is unsharded next for another."""
            @wraps(fn)
            def run(group: Any, *args: Any, **kwargs: Any) -> Any:
                if rec.c.recording:
                    rec._last = rec._guarded("FSDP pre-forward/pre-backward hook", rec._unit, group)
                return fn(group, *args, **kwargs)
            return run

        def in_forward(fn: Any, enters: bool) -> Any:
            """A unit's pre-forward (``enters``) or post-forward: what is saved between leaf modules meanwhile is the unit's."""
            @wraps(fn)
            def run(group: Any, *args: Any, **kwargs: Any) -> Any:
                if rec.c.recording:
                    rec._guarded("FSDP forward hook", rec.c.saved.unit_enter if enters else rec.c.saved.unit_leave,
                                 group._module_fqn or FSDP_ROOT)
                return fn(group, *args, **kwargs)
            return run

        patch(FSDPParamGroup, "pre_forward", lambda fn: in_forward(in_pass(fn), True))
        patch(FSDPParamGroup, "post_forward", lambda fn: in_forward(fn, False))
        patch(FSDPParamGroup, "pre_backward", in_pass)
        patch(FSDPParamGroup, "_prefetch_unshard", lambda fn: self._prefetched_by(fn, lambda *args, **kwargs: rec._last))
        patch(FSDPParamGroup, "unshard", lambda fn: self._within(fn, lambda args: rec._unshard(args[0])))
        patch(FSDPParamGroup, "post_backward", lambda fn: self._within(fn, lambda args: (rec._unit(args[0]), "backward", -1)))
        patch(FSDPParamGroup, "wait_for_unshard",
              lambda fn: self._spanned(fn, Rec.FSDP_COPY_OUT_BEGIN, lambda g: g._all_gather_result is not None, lambda g: True))
        patch(FSDPParamGroup, "reshard", lambda fn: self._spanned(fn, Rec.FSDP_RESHARD_BEGIN, lambda g: g.is_unsharded,
                                                                        lambda g: not g.is_unsharded))
        patch(FSDPParamGroup, "_to_unsharded", self._unsharded)
        # all_gather_single(output, input, group): the gathered (full) bytes; reduce_scatter_single(output,
        # input, ...) and all_reduce(tensor, ...): the bytes of the tensor reduced
        for name in tensor_collectives(dist, GATHER_NAMES):
            patch(dist, name, lambda fn: self._collective(fn, "all_gather", _tensor_arg("output_tensor", 0)))
        for name in tensor_collectives(dist, SCATTER_NAMES):
            patch(dist, name, lambda fn: self._collective(fn, "reduce_scatter", _tensor_arg("input", 1)))
        from torch.distributed import distributed_c10d

        for name, arg in JOB_CALLS.items():
            for owner in (dist, distributed_c10d):
                patch(owner, name, lambda fn, name=name, arg=arg: self._job_call(fn, name, arg))
        patch(dist, "all_reduce", lambda fn: self._collective(self._job_call(fn, "all_reduce", "tensor"), "all_reduce", _tensor_arg("tensor", 0)))
        patch(DTensor, "full_tensor", self._full_tensor)
        self._size_functional()
        if self._opt_hook is None:  # removed by ``release``: the window may end inside these hooks' loop (launcher mode)
            self._opt_hook = register_optimizer_step_pre_hook(self._before_step)

    def _size_functional(self) -> None:
        """The job's functional collectives (DTensor's: a TP layer's all-reduces) outside FSDP's calls, sized for Kineto's
        transfers as on a DDP job (``own_collectives``) for the window; FSDP's own and those inside a call recorded here
        are not. FSDP1's recorder too: its units' calls are c10d's, the job's TP layers' DTensor's."""
        pending: dict = {}
        self.c._restore.append(pending.clear)
        patch_functional(self.c, pending, self._recorded)

    def _patcher(self) -> Any:
        """``patch(owner, name, make)``: replace ``owner.name`` by ``make(original)`` until the window ends."""
        def patch(owner: Any, name: str, make: Any) -> None:
            original = owner.__dict__[name]
            fn = original.__func__ if isinstance(original, staticmethod) else original
            new = make(fn)
            setattr(owner, name, staticmethod(new) if isinstance(original, staticmethod) else new)
            self.c._restore.append(lambda: setattr(owner, name, original))
        return patch

    def _unsharded(self, fn: Any) -> Any:
        """A unit's ``_to_unsharded``: its gathered parameters, which a layer saves as its weight, are named to the saved-tensor
        hook (``SavedActivations.gathered``)."""
        rec = self

        @wraps(fn)
        def run(group: Any, *args: Any, **kwargs: Any) -> Any:
            out = fn(group, *args, **kwargs)
            if rec.c.recording:
                rec._guarded("FSDP unshard hook", lambda: rec.c.saved.gathered([fp.unsharded_param for fp in group.fsdp_params]))
            return out
        return run

    def _prefetched_by(self, fn: Any, by: Any) -> Any:
        """FSDP's prefetch ``fn``: the unit that prefetches (``by(*args, **kwargs)``) is on ``_prefetching`` while it runs."""
        rec = self

        @wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if not rec.c.recording:
                return fn(*args, **kwargs)
            rec._prefetching.append(by(*args, **kwargs))
            try:
                return fn(*args, **kwargs)
            finally:
                rec._prefetching.pop()
        return run

    def _unshard(self, unit: Any) -> tuple[int, str, int]:
        """The context (unit, pass, prefetched by) of an all-gather that unsharding ``unit`` (a param group, a handle) issues."""
        # IDLE: ``FSDPModule.unshard()`` called by hand, before a forward (FSDP2's own unshards set FORWARD or PRE_BACKWARD)
        phase = "forward" if unit._training_state.name in ("FORWARD", "IDLE") else "backward"
        return self._unit(unit), phase, self._prefetching[-1] if self._prefetching else -1

    def _within(self, fn: Any, context: Any) -> Any:
        """``fn`` runs with ``context(args)`` (unit, pass, prefetched by) as the context of the collectives it calls."""
        rec = self

        @wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            ctx = rec._guarded("FSDP unit hook", context, args) if rec.c.recording else None
            if ctx is None:
                return fn(*args, **kwargs)
            rec._context.append(ctx)
            try:
                return fn(*args, **kwargs)
            finally:
                rec._context.pop()
        return run

    def _spanned(self, fn: Any, begin: Rec, before: Any, after: Any) -> Any:
        """Records [begin, begin + 1] around a unit's method ``fn`` only when it did something (``before`` and ``after`` hold)."""
        rec = self

        @wraps(fn)
        def run(group: Any, *args: Any, **kwargs: Any) -> Any:
            if not rec.c.recording or not rec._guarded(f"FSDP hook {begin.name}", before, group):
                return fn(group, *args, **kwargs)
            t0 = time.time_ns()
            out = fn(group, *args, **kwargs)
            rec._guarded(f"FSDP hook {begin.name}", rec._span, group, begin, t0, after)
            return out
        return run

    def _span(self, group: Any, begin: Rec, t0: int, after: Any) -> None:
        if after(group):
            u, phase = self._unit(group), 0 if group._training_state.name == "FORWARD" else 1
            self.c.records.append((int(begin), u, phase, t0, 0))
            self.c.records.append((int(begin) + 1, u, phase, time.time_ns(), 0))

    def _guarded(self, where: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, or None after an error, which stops profiling with one warning: never the training
        (an FSDP whose internals moved fails here)."""
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001
            self.c._fail(err, where)
            return None

    def _collective(self, fn: Any, kind: str, measure: Any) -> Any:
        """A c10d collective that records each call made inside an FSDP unit's method (``_context``);
        ``measure(args, kwargs)``: (bytes, dtype, group) of the call."""
        import torch.distributed as dist

        rec = self

        @wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if not rec.c.recording or not rec._context:
                return fn(*args, **kwargs)
            index = rec._guarded(f"FSDP {kind} hook", lambda: rec._record(kind, *measure(args, kwargs), dist, rec._context[-1]))
            return fn(*args, **kwargs) if index is None else rec._timed(index, fn, args, kwargs)
        return run

    def _full_tensor(self, fn: Any) -> Any:
        """``DTensor.full_tensor`` called by the job (not inside an FSDP unit's method): a state_dict gathered for a save
        runs one all-gather per sharded parameter, which every rank issues in the same order; recorded as a collective
        of no unit (``FULL_TENSOR``) so the graph joins it across ranks and the link prices it. A DTensor sharded over
        more than one mesh dimension, or partial, runs other collectives: left unrecorded (host time, as before)."""
        import torch.distributed as dist

        rec = self

        @wraps(fn)
        def run(t: Any, *args: Any, **kwargs: Any) -> Any:
            if not rec.c.recording or rec._context:
                return fn(t, *args, **kwargs)
            index = rec._guarded("DTensor.full_tensor hook", rec._full_tensor_record, t, dist)
            return fn(t, *args, **kwargs) if index is None else rec._timed(index, fn, (t, *args), kwargs)
        return run

    def _full_tensor_record(self, t: Any, dist: Any) -> int | None:
        dims = [d for d, p in enumerate(t.placements) if not p.is_replicate()]
        if len(dims) != 1 or not t.placements[dims[0]].is_shard():
            return None
        return self._record("all_gather", t.numel() * t.element_size(), _dtype(t.dtype), t.device_mesh.get_group(dims[0]), dist,
                            (-1, FULL_TENSOR, -1))

    def _job_call(self, fn: Any, kind: str, arg: str | None) -> Any:
        """A blocking c10d call the job makes itself, outside FSDP's calls (``JOB_CALLS``, and ``all_reduce``): recorded as a
        collective of no unit (``JOB_CALL``), as ``_full_tensor``'s gathers, so the graph joins it across ranks and the link
        prices it. An ``async_op=True`` call blocks where it is waited for, not here: left unrecorded (host time, as before)."""
        import inspect

        import torch.distributed as dist

        signature = inspect.signature(fn)
        rec = self

        @wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if not rec.c.recording or rec._context:
                return fn(*args, **kwargs)
            index = rec._guarded(f"torch.distributed.{kind} hook", rec._job_record, kind, arg, signature, args, kwargs, dist)
            return fn(*args, **kwargs) if index is None else rec._timed(index, fn, args, kwargs)
        return run

    def _job_record(self, kind: str, arg: str | None, signature: Any, args: tuple, kwargs: dict, dist: Any) -> int | None:
        given = signature.bind(*args, **kwargs).arguments
        if given.get("async_op"):
            return None
        group, t = given.get("group"), given.get(arg) if arg else None
        # a kind priced as an all-gather (``CommKind.priced_as``: a gather, a scatter) moves the group's size times the
        # tensor, and is priced at all of it (FsdpCollective.nbytes)
        gathered = CommKind.from_label(kind).priced_as == CommKind.ALL_GATHER
        nbytes = 0 if t is None else t.numel() * t.element_size() * (dist.get_world_size(group) if gathered else 1)
        return self._record(kind, nbytes, _dtype(t.dtype if t is not None else None), group, dist, (-1, JOB_CALL, -1))

    def _timed(self, index: int, fn: Any, args: tuple, kwargs: dict) -> Any:
        """``fn(*args, **kwargs)`` between the records of collective ``index``."""
        paused = self.c.saved.pause()  # a collective keeps the thread-local hooks: none of ours must outlive the job
        self.c._mark(Rec.FSDP_COLL_BEGIN, index, self.collectives[index].unit)
        self._timing += 1
        try:
            return fn(*args, **kwargs)
        finally:
            self._timing -= 1
            self.c._mark(Rec.FSDP_COLL_END, index, self.collectives[index].unit)
            self.c.saved.resume(paused)

    def _recorded(self) -> bool:
        """Whether a collective called now is this recorder's: inside an FSDP unit's method or a call it times."""
        return bool(self._context) or self._timing > 0

    def _record(self, kind: str, nbytes: int, dtype: str, group: Any, dist: Any, context: tuple[int, str, int]) -> int:
        unit, phase, by = context
        self.collectives.append(FsdpCollective(kind=kind, unit=unit, phase=phase, prefetched_by=by, nbytes=nbytes, dtype=dtype,
                                                group=self._ranks_of(group, dist), issued_ns=time.time_ns()))
        return len(self.collectives) - 1

    def _ranks_of(self, group: Any, dist: Any) -> str:
        """The ranks of ``group`` (None: the world) joined by ",": read once per group, as c10d's lookup costs more than the
        rest of a collective's record (the group is held so its id stays its own)."""
        known = self._group_ranks.get(id(group))
        if known is None or known[0] is not group:
            ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
            known = self._group_ranks[id(group)] = (group, ",".join(map(str, ranks)))
        return known[1]

    def _before_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not self.c.recording:
            return
        try:
            self._optimizers.setdefault(id(opt), opt)
            grads = sum(_local_bytes(p.grad) for p in self._param_shards())
            self._grad_bytes = max(self._grad_bytes, grads)
        except Exception as err:  # noqa: BLE001
            self.c._fail(err, "FSDP optimizer hook")

    def _param_shards(self) -> list[Any]:
        """This rank's parameter shards (their ``.grad``: the gradient shards)."""
        return [fp.sharded_param for g in self.groups for fp in g.fsdp_params]

    # ------------------------------------------------------------ output
    def end(self) -> None:
        """Sharded memory per rank as the window ends (the model is still referenced)."""
        self._collect_units()
        params = sum(_local_bytes(p) for p in self._param_shards())
        state = sum(_local_bytes(v) for opt in self._optimizers.values() for s in opt.state.values() for v in s.values()
                    if getattr(v, "dim", lambda: 0)() > 0)
        self._memory = {"param_shard_bytes": params, "grad_shard_bytes": self._grad_bytes, "optim_state_bytes": state}

    def release(self) -> None:
        """Drop the optimizer hook and every reference to the model (the collector is done)."""
        if self._opt_hook is not None:
            self._opt_hook.remove()
            self._opt_hook = None
        self._optimizers.clear()
        self._group_ranks.clear()
        self.modules = []

    def _untimed_roots(self, root: dict[int, int | None]) -> dict[int, str]:
        """id(group) -> the class of its ``fully_shard`` root, for each unit outside the models the collector attached
        (``root``: id(group) -> its attached root's index; FSDP's class-level hooks see every root's units, the leaf hooks
        only the attached models')."""
        foreign = [g for g in self.groups if root[id(g)] is None]
        roots = [g.modules[0] for g in foreign if not g._module_fqn]
        def root_of(g: Any) -> Any:
            return next((r for r in roots if any(m is g.modules[0] for m in r.modules())), g.modules[0])
        return {id(g): type(root_of(g)).__name__.removeprefix("FSDP") for g in foreign}  # fully_shard's class: FSDP<class>

    def info(self, layers: list[str]) -> FsdpInfo:
        units = []
        root = {id(g): self.c.root_of(g.modules[0]) for g in self.groups}
        untimed = self._untimed_roots(root)
        # a unit's module path as the layers name it: another attached root's prefixed, its root unit the prefix itself
        path = {id(g): (self.c.root_prefix(k) + g._module_fqn).rstrip(".") if k else g._module_fqn for g in self.groups
                if (k := root[id(g)]) is not None}
        for g in self.groups:
            fqn = path.get(id(g), g._module_fqn) or FSDP_ROOT
            own = [] if id(g) in untimed else own_layers(path[id(g)], [p for i, p in path.items() if i != id(g)], layers)
            fps = g.fsdp_params
            mesh = g.mesh_info.mesh
            dtype = g._orig_dtype or (fps[0].orig_dtype if fps else None)  # FSDP gives a unit of frozen parameters none: theirs
            units.append(FsdpUnit(
                name=fqn, layers=own, params=[fp._param_fqn or "?" for fp in fps],
                numel=sum(fp._orig_size.numel() for fp in fps),
                shard_bytes=sum(_local_bytes(fp.sharded_param) for fp in fps),
                orig_dtype=_dtype(dtype), param_dtype=_dtype((fps[0].param_dtype or fps[0].orig_dtype) if fps else None),
                # read when the rank file is written, after lazy init: a root left at fully_shard's default (None) reads False
                reduce_dtype=_dtype(g._reduce_dtype or dtype), reshard_after_forward=bool(g._reshard_after_forward),
                offload=bool(fps) and fps[0].offload_to_cpu,
                reshard_to=post.shard_mesh_size if (post := g.post_forward_mesh_info) is not None and g._use_post_forward_mesh else 0,
                mesh=list(mesh.shape), mesh_dims=list(mesh.mesh_dim_names or ()),
                frozen_numel=sum(fp._orig_size.numel() for fp in fps if not fp.sharded_param.requires_grad),
                frozen_tensors=sum(not fp.sharded_param.requires_grad for fp in fps), untimed_root=untimed.get(id(g), ""),
                root=root[id(g)] or 0,
            ))
        return FsdpInfo(units=units, collectives=self.collectives, layer_saved_gathered_bytes=dict(self.c.saved.most_gathered),
                       layer_output_bytes=dict(self.c.saved.most_output), layer_input_bytes=dict(self.c.saved.most_input),
                       unit_saved_outside_bytes=dict(self.c.saved.most_unit_outside),
                       **self._memory)


def own_layers(fqn: str, others: list[str], layers: list[str]) -> list[int]:
    """The leaf layers (indexes into ``layers``) that the unit of module ``fqn`` ("": the root) runs itself:
    those under it, less those under another unit (``others``: their module paths) nested in it. A unit of
    several modules (``fully_shard([blocks.0, blocks.1])``) has their paths joined by ", " as its ``fqn``."""
    def under(name: str, path: str) -> bool:  # a unit may be a leaf module itself (size_based_auto_wrap_policy wraps those)
        return not path or name == path or name.startswith(path + ".")

    def under_unit(name: str, unit: str) -> bool:
        return any(under(name, path) for path in (unit.split(", ") if unit else [""]))

    inner = [m for m in others if m and m != fqn and any(under_unit(path, fqn) for path in m.split(", "))]
    return [i for i, name in enumerate(layers) if under_unit(name, fqn) and not any(under_unit(name, m) for m in inner)]


def _tensor_arg(name: str, pos: int) -> Any:
    """``measure`` for ``FsdpRecorder._collective``: the bytes and dtype of one tensor argument, and the ``group``."""
    def measure(args: tuple, kwargs: dict) -> tuple[int, str, Any]:
        t = kwargs.get(name, args[pos] if len(args) > pos else None)
        return (t.numel() * t.element_size() if t is not None else 0), _dtype(t.dtype if t is not None else None), kwargs.get("group")
    return measure


def _local_bytes(t: Any) -> int:
    """Bytes this rank holds of a tensor or DTensor (0 for None). A DTensor's local tensor is read as its attribute:
    ``to_local()`` (an autograd function, the same tensor's view) cost 6 us a parameter in every step's optimizer hook."""
    if t is None:
        return 0
    local = getattr(t, "_local_tensor", None)
    t = local if local is not None else t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def _dtype(d: Any) -> str:
    return str(d).removeprefix("torch.") if d is not None else ""


def install_launcher(collector: Any, after_import: Any) -> None:
    """Zero-code mode: the root FSDP module's first forward attaches the collector and starts step 0; every other
    ``fully_shard`` root (a GAN's discriminator, a DINO student beside its teacher) is attached too, at once or at its first
    forward, so each root's layers are timed."""

    def attach(root: Any) -> None:
        collector.attach(root)
        collector.start()

    on_root_forward(after_import, attach, collector.attach)


def on_root_forward(after_import: Any, fn: Any, later: Any = None) -> None:
    """Call ``fn(root)`` at the first forward of a ``fully_shard``-ed module (the outermost: the root), once: the first
    ``fully_shard`` call arms a global forward pre-hook, removed when it fires. With ``later``, call ``later(root)`` for each
    other root: those sharded by then at once, one sharded afterwards at its first forward (a hook on that module only)."""

    def armed(fully_shard: Any) -> Any:
        @wraps(fully_shard)
        def run(*args: Any, **kwargs: Any) -> Any:
            out = fully_shard(*args, **kwargs)
            module = args[0] if args else kwargs.get("module")
            if not state:
                from torch.compiler import disable
                from torch.nn.modules.module import register_module_forward_pre_hook

                # eager: under ``model.compile()`` Dynamo would trace the collector's attach, breaking at each call it cannot
                state.append(register_module_forward_pre_hook(disable(first_forward)))
            if later is not None and hasattr(module, "register_forward_pre_hook"):  # not fully_shard([a, b]): inner units
                if attached:
                    from torch.compiler import disable

                    hooks[id(module)] = module.register_forward_pre_hook(disable(lambda m, inputs: another(m)))
                else:
                    sharded.append(module)
            return out
        return run

    state: list[Any] = []
    attached: list[Any] = []  # the roots called back, once the first forward ran
    sharded: list[Any] = []  # modules fully_shard-ed before that
    hooks: dict[int, Any] = {}

    def inside(module: Any) -> bool:
        return any(module is m for r in attached for m in r.modules())

    def another(module: Any) -> None:
        hook = hooks.pop(id(module), None)
        if hook is not None:
            hook.remove()
        if not inside(module):
            attached.append(module)
            later(module)

    def first_forward(module: Any, inputs: Any) -> None:
        if fsdp_modules(module) and state[0] is not None:
            state[0].remove()
            state[0] = None
            attached.append(module)
            fn(module)
            for m in sharded:  # each root's outermost module is sharded last, after its inner units
                if not inside(m) and not any(m is x for s in sharded if s is not m for x in s.modules()):
                    another(m)

    def patch(name: str) -> Any:
        def run(module: Any) -> None:
            if hasattr(module, name):
                setattr(module, name, armed(getattr(module, name)))
        return run

    after_import("torch.distributed.fsdp", patch("fully_shard"))
    # torch's FSDP-based replicate() (``replicate_with_fsdp``): FSDP2's units on a 1-D "replicate" mesh, each all-reduced
    after_import("torch.distributed._composable.replicate_with_fsdp", patch("replicate"))
