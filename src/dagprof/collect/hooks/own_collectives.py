"""The bytes of the collectives a DDP model calls itself inside its ops (a loss's differentiable ``all_gather`` and the
scatters of its backward, a synchronised BatchNorm's statistics, embeddings gathered asynchronously, DTensor's
redistributions), so that link what-ifs can re-price them.

Kineto records no sizes without ``record_shapes`` (+70..100 % on small CPU ops), and these calls run inside the
model's ops where no hook sees them. So during the window (and only then) the functions they go through are patched to
write one record per call: kind, group size, bytes per rank (the tensor Kineto's ``Input Dims`` would give).
``torch.distributed``'s blocking calls write ``Rec.OWN_COLL``. Its ``async_op=True`` calls and the functional
collectives DTensor uses (``torch.distributed._functional_collectives``: ``all_gather_single``, ``all_reduce``,
``broadcast``, ``all_to_all_single``, ``reduce_scatter_single`` and what calls them) block nothing where they are
issued, but where their work's ``wait()`` or ``wait_tensor`` is called: they write ``Rec.OWN_ASYNC``, and
``Rec.OWN_WAIT`` when the first wait for them begins. An asynchronous call from the library itself is not recorded:
DDP's comm hook (a frame of the hook's code: ``collect.hooks.ddp_buckets``'s, which runs the user's inside) and ZeRO's
parameter broadcasts have recorders of their own. A comm hook of the user's own is no library: every collective it
calls for a bucket, on the thread that runs it (``DdpBuckets.hook_call``), is its wire, recorded against the bucket's
call (``Rec.HOOK_COLL`` issued for later, ``Rec.HOOK_BLOCKING`` blocking; bytes -1 in a group other than DDP's), and every
one it calls later from a callback it chained on a future (``Future.then``, ``add_done_callback``: ``DdpBuckets.chained``)
is ``Rec.HOOK_LATE``. DDP's
broadcasts of its buffers (``broadcast_buffers=True``), run by c10d outside these functions, are recorded one per
transfer by ``_buffer_broadcasts``. The reader matches the records to Kineto's transfers by kind in issue order
(``traces.run_comm``). Internal calls between c10d's own functions do not go through the patched attributes
(``all_gather_tensor`` calls the patched ``all_gather_single`` once), so each call of the model is counted once
(FSDP's recorder patches the same ``torch.distributed`` names for its own collectives, so this one stays off there; but it
patches the functional collectives as here, ``patch_functional``, for the job's DTensor calls outside FSDP's own).
"""
from __future__ import annotations

import inspect
import sys
import threading
import time
from functools import partial, wraps
from typing import Any

from ...traces.comm_kind import CommKind
from ...traces.run_schema import OWN_KINDS, Rec
from .ddp_buckets import hook_code

# torch.distributed function -> (kind, the argument holding the per-rank tensor); an FSDP job's own calls are another
# recorder's (``fsdp.JOB_CALLS``: whole collectives, not bytes for Kineto's transfers; its comment says why the names differ)
OWN_CALLS = {
    "all_gather": (CommKind.ALL_GATHER, "tensor"),
    "all_gather_into_tensor": (CommKind.ALL_GATHER, "input_tensor"),
    "all_gather_single": (CommKind.ALL_GATHER, "input_tensor"),
    "all_reduce": (CommKind.ALL_REDUCE, "tensor"),
    "scatter": (CommKind.SCATTER, "tensor"),
    "gather": (CommKind.GATHER, "tensor"),
    "broadcast": (CommKind.BROADCAST, "tensor"),
    "all_to_all_single": (CommKind.ALL_TO_ALL, "input"),  # an expert layer's token exchange (``torch.distributed.nn.functional``'s too)
}
# torch.distributed._functional_collectives function -> (kind, where its group is among the arguments after the per-rank
# tensor, its first, ``self``); ``all_to_all_single_autograd`` calls the patched ``all_to_all_single``, ``reduce_scatter_tensor``
# (DTensor's Partial -> Shard) and ``reduce_scatter_single_autograd`` the patched ``reduce_scatter_single``
FUNCTIONAL_CALLS = {"all_gather_single": (CommKind.ALL_GATHER, 1), "all_gather_single_autograd": (CommKind.ALL_GATHER, 1),
                    "all_reduce": (CommKind.ALL_REDUCE, 1), "broadcast": (CommKind.BROADCAST, 1),
                    "all_to_all_single": (CommKind.ALL_TO_ALL, 2), "reduce_scatter_single": (CommKind.REDUCE_SCATTER, 2)}
_LIBRARY = ("torch.distributed.optim", "torch.distributed.algorithms")  # ZeRO's step, DDP's comm hooks
# torch.distributed's reduce-scatters of one tensor: gloo runs each as an all-reduce of the whole input
# (``traces.kineto._host_coll``), recorded so (the input's bytes) outside a comm hook of the user's own; another backend's
# transfer is a reduce-scatter no record names, not sized, as a hook's is not (``_reduce_scatter``)
REDUCE_SCATTERS = ("reduce_scatter_tensor", "reduce_scatter_single")
# calls the collector does not size: marked only where the user's own comm hook makes them (``_in_hook_only``)
HOOK_ONLY_CALLS = ("reduce_scatter", "reduce", "all_to_all", "send", "recv", "isend", "irecv",
                   "batch_isend_irecv", "barrier", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list")


def patch_own_collectives(collector: Any) -> None:
    """Patch ``torch.distributed``'s collectives, its work's ``wait`` and the functional collectives for the window; the
    collector's ``_restore`` undoes it."""
    import torch.distributed as dist

    pending: dict[int, tuple[Any, int, int]] = {}  # id(work or output tensor) -> (it, kind, its call's time): waits to come
    collector._restore.append(pending.clear)
    hooks = _comm_hook_codes(collector._ddps)
    for name, (kind, arg) in OWN_CALLS.items():
        _patch(collector, dist, name, partial(_recording, collector, pending, hooks, OWN_KINDS.index(kind), arg))
    for name in HOOK_ONLY_CALLS:
        _patch(collector, dist, name, partial(_in_hook_only, collector))
    for name in REDUCE_SCATTERS:
        _patch(collector, dist, name, partial(_reduce_scatter, collector, pending, hooks))
    _patch(collector, dist.Work, "wait", partial(_waiting, collector, pending))
    import torch

    for name in ("then", "add_done_callback"):  # torch.futures.Future's call these
        _patch(collector, torch._C.Future, name, partial(_chaining, collector))
    from torch.nn.parallel import DistributedDataParallel

    _patch(collector, DistributedDataParallel, "_distributed_broadcast_coalesced", partial(_buffer_broadcasts, collector))
    patch_functional(collector, pending)


def patch_functional(collector: Any, pending: dict, skip: Any = None) -> None:
    """Patch the functional collectives DTensor uses and their ``wait_tensor`` for the window, each call not ``skip()``-ed
    written as ``Rec.OWN_ASYNC`` (its first wait ``Rec.OWN_WAIT``). An FSDP job's recorder calls this too, skipping its own
    calls (``fsdp.FsdpRecorder._recorded``: FSDP's, and a ``full_tensor`` it records whole), so that a DP x TP job's tensor-parallel
    all-reduces are sized there as on a DDP job."""
    # a job that uses them (DTensor) has imported them; importing them here would cost every other job 65 ms in its window
    funcol = sys.modules.get("torch.distributed._functional_collectives")
    if funcol is not None:
        for name, (kind, at) in FUNCTIONAL_CALLS.items():
            _patch(collector, funcol, name, partial(_functional, collector, pending, kind, at, skip))
        _patch(collector, funcol, "wait_tensor", partial(_waiting, collector, pending))


def _patch(collector: Any, owner: Any, name: str, wrap: Any) -> None:
    original = owner.__dict__.get(name)
    if original is None:
        return
    setattr(owner, name, wrap(original))
    collector._restore.append(lambda: setattr(owner, name, original))


def _recording(collector: Any, pending: dict, hooks: frozenset, kind: int, arg: str, fn: Any) -> Any:
    signature = inspect.signature(fn)

    @wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not collector.recording:
            return fn(*args, **kwargs)
        record = None
        try:  # records only: the call itself runs once, below, whatever happens here
            given = signature.bind(*args, **kwargs).arguments
            asynchronous = bool(given.get("async_op", False))
            hooked = (_in_own_hook(collector, kind, asynchronous, given.get("group"), given[arg])
                      or _late_in_own_hook(collector, kind, given[arg]))
            if not hooked and not (asynchronous and _from_library(sys._getframe(1), hooks)):
                import torch.distributed as dist

                tensor = given[arg]
                record = [Rec.OWN_ASYNC if asynchronous else Rec.OWN_COLL, kind, dist.get_world_size(given.get("group")),
                          time.time_ns(), tensor.numel() * tensor.element_size()]
                collector.records.append(tuple(record))
        except Exception as err:  # noqa: BLE001
            collector._fail(err, f"torch.distributed.{fn.__name__} (the model's own collective)")
        work = fn(*args, **kwargs)
        if record is not None and record[0] == Rec.OWN_ASYNC and work is not None:
            pending[id(work)] = (work, kind, record[3])
        return work
    return call


def _functional(collector: Any, pending: dict, kind: CommKind, at: int, skip: Any, fn: Any) -> Any:
    @wraps(fn)
    def call(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if not collector.recording or (skip is not None and skip()):
            return fn(tensor, *args, **kwargs)
        record = None
        try:
            import torch.distributed._functional_collectives as funcol
            from torch.distributed.distributed_c10d import _resolve_process_group

            group = kwargs.get("group", args[at] if len(args) > at else None)
            pg = _resolve_process_group(funcol._resolve_group_name(group, kwargs.get("tag", "")))
            index = OWN_KINDS.index(kind) if kind in OWN_KINDS else -1
            hooked = _in_own_hook(collector, index, True, pg, tensor) or _late_in_own_hook(collector, index, tensor)
            # a reduce-scatter: gloo runs it as an all-reduce of the whole input (``traces.kineto._host_coll``), recorded so,
            # the input's bytes; another backend's transfer is a reduce-scatter the records do not name, so it is not recorded
            if not hooked and (kind != CommKind.REDUCE_SCATTER or pg.name() == "gloo"):
                record = (Rec.OWN_ASYNC, OWN_KINDS.index(CommKind.ALL_REDUCE if kind == CommKind.REDUCE_SCATTER else kind), pg.size(), time.time_ns(),
                          tensor.numel() * tensor.element_size())
                collector.records.append(record)
        except Exception as err:  # noqa: BLE001
            collector._fail(err, f"torch.distributed._functional_collectives.{fn.__name__} (the model's own collective)")
        out = fn(tensor, *args, **kwargs)
        if record is not None:
            elem = getattr(out, "elem", out)  # an AsyncCollectiveTensor's wait_tensor is called on its elem
            pending[id(elem)] = (elem, record[1], record[3])
        return out
    return call


def _reduce_scatter(collector: Any, pending: dict, hooks: frozenset, fn: Any) -> Any:
    """A reduce-scatter of one tensor recorded as the all-reduce gloo runs for it (``_recording``), where gloo runs it
    and no comm hook of the user's calls it; else as a call the collector does not size (``_in_hook_only``)."""
    sized = _recording(collector, pending, hooks, OWN_KINDS.index(CommKind.ALL_REDUCE), "input", fn)
    unsized = _in_hook_only(collector, fn)
    signature = inspect.signature(fn)

    @wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        gloo = False
        if collector.recording:
            try:
                import torch.distributed as dist

                given = signature.bind(*args, **kwargs).arguments
                call = collector._buckets.hook_call
                hooked = (call is not None and call[1] == threading.get_ident()) or collector._buckets.in_hook_callback()
                gloo = not hooked and given["input"].device.type == "cpu" and "gloo" in str(dist.get_backend(given.get("group")))
            except Exception as err:  # noqa: BLE001
                collector._fail(err, f"torch.distributed.{fn.__name__} (the model's own collective)")
        return (sized if gloo else unsized)(*args, **kwargs)
    return call


def _in_hook_only(collector: Any, fn: Any) -> Any:
    """A collective the collector does not size, written (unknown kind and bytes) where the user's own comm hook calls it for
    a bucket, or later from its callbacks (``Rec.HOOK_LATE``): the reader then leaves that call (every call) unpriced and its
    wire is refused, never priced at the hook's other calls alone."""
    @wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if collector.recording:
            try:
                hook = collector._buckets.hook_call
                if hook is not None and hook[1] == threading.get_ident():
                    collector.records.append((Rec.HOOK_COLL, len(OWN_KINDS), hook[0], time.time_ns(), -1))
                elif collector._buckets.in_hook_callback():
                    collector.records.append((Rec.HOOK_LATE, len(OWN_KINDS), -1, time.time_ns(), -1))
            except Exception as err:  # noqa: BLE001
                collector._fail(err, f"torch.distributed.{fn.__name__} (a comm hook's collective)")
        return fn(*args, **kwargs)
    return call


def _in_own_hook(collector: Any, kind: int, asynchronous: bool, group: Any, tensor: Any) -> bool:
    """Whether the call is the user's own comm hook's for a bucket (``DdpBuckets.hook_call``), and if so its record
    written: its bytes per rank, -1 where its group is not DDP's or its kind no recorded one (the reader refuses those)."""
    buckets = collector._buckets
    call = buckets.hook_call
    if call is None or call[1] != threading.get_ident():
        return False
    import torch.distributed as dist

    ranks = group.size() if hasattr(group, "size") else dist.get_world_size(group)
    nbytes = tensor.numel() * tensor.element_size() if ranks == buckets.world and kind >= 0 else -1
    collector.records.append((Rec.HOOK_COLL if asynchronous else Rec.HOOK_BLOCKING, kind if kind >= 0 else len(OWN_KINDS), call[0],
                              time.time_ns(), nbytes))
    return True


def _late_in_own_hook(collector: Any, kind: int, tensor: Any) -> bool:
    """Whether a call outside the user's own hook's calls comes from a callback the hook chained on a future
    (``DdpBuckets.chained``), and if so its ``Rec.HOOK_LATE`` written: wire no bucket call holds."""
    if not collector._buckets.in_hook_callback():
        return False
    collector.records.append((Rec.HOOK_LATE, kind if kind >= 0 else len(OWN_KINDS), -1, time.time_ns(), tensor.numel() * tensor.element_size()))
    return True


def _chaining(collector: Any, fn: Any) -> Any:
    """``Future.then`` (``add_done_callback``) counting the callback as the user's own hook's where the hook chains it
    (``DdpBuckets.chains_for_hook``); any other callback is chained as given."""
    @wraps(fn)
    def chain(fut: Any, callback: Any, *args: Any, **kwargs: Any) -> Any:
        if collector.recording and collector._buckets.chains_for_hook():
            callback = collector._buckets.chained(callback)
        return fn(fut, callback, *args, **kwargs)
    return chain


def _buffer_broadcasts(collector: Any, fn: Any) -> Any:
    """DDP's ``_distributed_broadcast_coalesced`` (``broadcast_buffers=True``: BatchNorm's running statistics from rank 0
    before each forward) writing one ``Rec.OWN_COLL`` broadcast per transfer it makes: c10d broadcasts the buffers of each
    dtype flattened, dtypes in the order of their first buffer (a model's int64 ``count``, then float64, then float32:
    three ``gloo:broadcast`` in that order). A dtype past the bucket size would be split, in another order: none recorded."""
    @wraps(fn)
    def call(ddp: Any, tensors: Any, buffer_size: int, *args: Any, **kwargs: Any) -> Any:
        if collector.recording:
            try:
                groups: dict[Any, int] = {}
                for t in tensors:
                    groups[(t.device, t.dtype)] = groups.get((t.device, t.dtype), 0) + t.numel() * t.element_size()
                if all(b < buffer_size for b in groups.values()):
                    ranks = ddp.process_group.size()
                    collector.records.extend((Rec.OWN_COLL, OWN_KINDS.index(CommKind.BROADCAST), ranks, time.time_ns(), b) for b in groups.values())
            except Exception as err:  # noqa: BLE001
                collector._fail(err, "DistributedDataParallel's buffer broadcast")
        return fn(ddp, tensors, buffer_size, *args, **kwargs)
    return call


def _waiting(collector: Any, pending: dict, fn: Any) -> Any:
    """``fn`` (a work's ``wait``, ``wait_tensor``) writing ``Rec.OWN_WAIT`` when it first waits for a recorded call."""
    @wraps(fn)
    def wait(it: Any, *args: Any, **kwargs: Any) -> Any:
        called = pending.pop(id(it), None)
        if called is not None and called[0] is it and collector.recording:
            collector.records.append((Rec.OWN_WAIT, called[1], 0, time.time_ns(), called[2]))
        return fn(it, *args, **kwargs)
    return wait


def _comm_hook_codes(ddps: list) -> frozenset:
    """The code of each DDP model's comm hook: dagprof's own (``collect.hooks.ddp_buckets``, which runs the user's inside),
    or one the job registered before dagprof attached. Told by code, not by a ``GradBucket`` among a frame's locals:
    reading every frame's locals cost an asynchronous call 1.2 us a frame (``bench/own_call_cost.py``)."""
    codes = set()
    for ddp in ddps:
        for hook, _ in getattr(ddp, "_comm_hooks", ()):
            if (code := hook_code(hook)) is not None:
                codes.add(code)
    return frozenset(codes)


def _from_library(frame: Any, hooks: frozenset) -> bool:
    """Whether an asynchronous call is the library's own: issued under a DDP comm hook (``hooks``: its code) or by
    ``torch.distributed``'s optimizers and comm hooks (ZeRO's broadcasts)."""
    while frame is not None:
        if frame.f_code in hooks or frame.f_globals.get("__name__", "").startswith(_LIBRARY):
            return True
        frame = frame.f_back
    return False
