"""DDP's gradient buckets: when each bucket's all-reduce was enqueued and completed, and which parameters it held.

DDP allows one comm hook, so ours wraps the bucket all-reduce for the life of the model and passes through outside the
window; a hook the user registers later runs inside ours instead of being refused. A bucket's layout (its bytes and
parameters) is read at each call: DDP rebuilds its buckets after the first step, and each distinct layout is kept.
ZeRO's ``hook_with_zero_step`` as the user's hook steps the optimizer inside the last bucket's call: ``zero.ZeroOverlap``
records that, and the call's issue span ends where its all-reduce was issued (``issued_at``).
A hook of the user's own (not torch's fp16/bf16 casts, not ZeRO's) puts its own collectives on the wire: while it runs for
a bucket, ``hook_call`` names the call, and ``collect.hooks.own_collectives`` records each collective the hook calls
(``Rec.HOOK_COLL``, ``Rec.HOOK_BLOCKING``) against it, and each it calls later from a callback it chained on a future
(``DdpBuckets.chained``: ``Rec.HOOK_LATE``).
"""
from __future__ import annotations

import threading
import time
import types
from dataclasses import dataclass
from typing import Any, Callable

from ...traces.buckets import Bucket, BucketLayout
from ...traces.run_schema import REPLICATE_API, DdpApi, Rec
from .exit_gc import hold_group
from .zero import ZeroOverlap


def sparse_wire_bytes(grad: Any, world: int) -> int:
    """Bytes gloo moves for a bucket's sparse gradient (``nn.Embedding(sparse=True)``: DDP gives it a bucket of its own):
    its all-reduce all-gathers every rank's coalesced indices and values, so the ranks together gather ``world`` times
    this rank's (the ranks' touched rows differ a little; each rank records its own estimate). The dense size the
    buffer reports (``numel``) is the whole table: ``bench/ddp_fresh/sparse_recsys.py``'s 5 MiB tables touched 0.3 MiB a
    step, and priced at 5 MiB its 200 Mbit/s what-if came out +419 %."""
    g = grad if grad.is_coalesced() else grad.coalesce()
    idx, val = g._indices(), g._values()
    return world * (idx.numel() * idx.element_size() + val.numel() * val.element_size())


class DdpBuckets:
    """Every DDP model's bucket all-reduces, as records appended to ``records``, and the layouts seen (``layouts``)."""

    def __init__(self, records: list, recording: Callable[[], bool], fail: Callable[[BaseException, str], None], warnings: list[str],
                 param_names: dict[int, str], param_shapes: dict[int, tuple[int, ...]]) -> None:
        self._records = records
        self._recording = recording
        self._fail = fail
        self._warnings = warnings
        self._param_names = param_names  # id(parameter) -> its name, filled as models are attached
        self._param_shapes = param_shapes
        self._seq = 0
        self._bucket_ids: dict[tuple[int, int], int] = {}  # (DDP model, its bucket index) -> bucket number in the records
        self._layout_key: dict[int, tuple] = {}  # bucket index -> (bytes, parameter ids) at its last call
        self._new_layout = False  # a bucket's layout changed this step
        self.layouts: list[BucketLayout] = []  # one per distinct layout seen, in order
        self.cap_mb: float | None = None  # the last DDP model's bucket_cap_mb
        self.models = 0  # DDP models attached (a GAN's generator and discriminator: 2)
        self.api: DdpApi = ""  # REPLICATE_API where a model's DDP is the composable replicate()'s ("": DistributedDataParallel)
        self.comm_hook = ""  # the user's own DDP comm hook ("" = DDP's all-reduce)
        # a DDP model with find_unused_parameters=True and no static graph: it all-reduces which parameters got a gradient
        # each step and never rebuilds its buckets (with static_graph=True it does neither after the first step)
        self.find_unused = False
        self.zero: ZeroOverlap | None = None  # ZeroRedundancyOptimizer(overlap_with_ddp=True) stepped by the user's hook
        self.issued_at: int | None = None  # when the current call's all-reduce was issued, where the hook says (ZeroOverlap)
        self.world = 1  # ranks of the last DDP model's process group
        self.hook_call: tuple[int, int] | None = None  # (seq, thread) while the user's own hook runs for a bucket
        self._late = threading.local()  # .depth: callbacks of that hook (``chained``) running on this thread

    def install(self, ddp: Any, composable: bool = False) -> None:
        """Wrap ``ddp``'s bucket all-reduce (module docstring) and note its bucket cap; ``composable``: the DDP the
        composable ``replicate()`` built (the user registers a comm hook on the module, replicate() on this DDP)."""
        self._wrap(ddp, self.models)
        self.api = self.api or (REPLICATE_API if composable else "")
        hold_group(ddp)  # its group never freed by the reducer with the GIL held (``exit_gc``)
        self.models += 1
        self.world = ddp.process_group.size()
        self.cap_mb = getattr(ddp, "bucket_bytes_cap", 0) / 2**20 or None
        self.find_unused = self.find_unused or (bool(getattr(ddp, "find_unused_parameters", False)) and not getattr(ddp, "static_graph", False))

    def new_step(self) -> None:
        self._new_layout = False

    def end_step(self) -> None:
        """Keep the step's layout where it is new (or the first)."""
        if self._new_layout or not self.layouts:
            self.layouts.append(self._layout())

    def _wrap(self, ddp: Any, model: int) -> None:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if getattr(ddp, "_comm_hooks", None):
            self._warnings.append("DDP already had a comm hook: per-bucket timings come from Kineto only")
            return
        inner = _Registered(default_hooks.allreduce_hook, ddp.process_group)
        buckets = self

        def dagprof_comm_hook(state: object, bucket):  # parameter must be named "bucket" (DDP checks)
            if not buckets._recording():
                return inner.hook(inner.state, bucket)
            t0, seq = time.time_ns(), buckets.next_seq()  # numbered before the broadcasts ZeRO's hook issues inside
            buckets.issued_at = None
            buckets.hook_call = (seq, threading.get_ident()) if inner.own else None
            try:
                fut = inner.hook(inner.state, bucket)
            finally:
                buckets.hook_call = None
            try:
                return buckets._record(bucket, seq, t0, buckets.issued_at or time.time_ns(), fut, model, inner.half)
            except Exception as err:  # noqa: BLE001
                buckets._fail(err, "DDP comm hook")
                return fut

        def register_comm_hook(state: object, hook: Any) -> None:
            # DDP's own checks, in its order, so a hook DDP refuses is refused with its error and the user's outcome is
            # DDP's (a callable object or a partial has no __name__; a second hook, the reducer's "only once")
            check = getattr(type(ddp), "_check_comm_hook", None)
            if check is not None:
                check(ddp, hook)
            name = hook.__qualname__
            if inner.registered:
                dist._register_comm_hook(ddp.reducer, state, hook)  # raises the reducer's own error: it holds our hook
            inner.registered = True
            if getattr(ddp, "logger", None) is not None:
                ddp.logger._set_comm_hook_name(name)  # what DDP's logging data names, as without dagprof
            # torch's fp16/bf16 compression all-reduces the bucket cast to 2 bytes per element; any other hook's wire
            # bytes are its own (PowerSGD's factors): named in the rank file, and what-ifs that price them refuse
            half = hook in (default_hooks.fp16_compress_hook, default_hooks.bf16_compress_hook)
            inner.hook, inner.state, inner.half = hook, state, half
            try:
                zero = ZeroOverlap.of(hook, buckets) if buckets.zero is None else None
            except Exception as err:  # noqa: BLE001  (the user's hook is registered all the same)
                buckets._fail(err, "reading ZeroRedundancyOptimizer's comm hook")
                zero = None
            buckets.zero = buckets.zero or zero
            inner.own = not half and buckets.zero is None and hook is not default_hooks.allreduce_hook
            buckets.comm_hook = buckets.comm_hook or (zero.name if zero else name)

        ddp.register_comm_hook(None, dagprof_comm_hook)
        ddp.register_comm_hook = register_comm_hook  # the user's hook runs inside ours
        ddp._dagprof_comm_hook = (None, dagprof_comm_hook)  # dagprof.apply re-registers it if it rebuilds the reducer

    def recording(self) -> bool:
        return self._recording()

    def append(self, record: tuple[int, int, int, int, int]) -> None:
        self._records.append(record)

    def warn(self, message: str) -> None:
        self._warnings.append(message)

    def fail(self, err: BaseException, where: str) -> None:
        """Profiling stops after an error in ``where`` (the collector's guard); the training goes on."""
        self._fail(err, where)

    def next_seq(self) -> int:
        """The next collective's number: every rank issues the comm hook's collectives in one order."""
        self._seq += 1
        return self._seq - 1

    def chains_for_hook(self) -> bool:
        """Whether a callback chained on a future now is the user's own hook's: chained in its call for a bucket, on the
        thread that runs it, or in a callback of the hook's (PowerSGD chains its next all-reduce from the last's)."""
        call = self.hook_call
        return (call is not None and call[1] == threading.get_ident()) or self.in_hook_callback()

    def in_hook_callback(self) -> bool:
        """Whether a callback of the user's own hook (``chained``) runs on this thread now."""
        return getattr(self._late, "depth", 0) > 0

    def chained(self, callback: Callable) -> Callable:
        """``callback``, which the user's own hook chains on a future, counted as the hook's while it runs (a collective it
        calls after the hook's call is ``Rec.HOOK_LATE``). Told where it is chained (``Future.then``), not by where it was
        defined: a bound method, a ``functools.partial``, a callable object or another module's function is the hook's as
        much as a closure (PowerSGD's, ``dagprof.apply``'s wrapper of it)."""
        late = self._late

        def hooks_callback(*args: Any) -> Any:
            late.depth = getattr(late, "depth", 0) + 1
            try:
                return callback(*args)
            finally:
                late.depth -= 1

        return hooks_callback

    def on_done(self, fut: Any, index: int, seq: int) -> Any:
        """``fut`` with its completion recorded (``Rec.COMM_DONE``: when, and the thread that completed it)."""
        records = self._records

        def done(f: Any) -> Any:
            records.append((Rec.COMM_DONE, index, seq, time.time_ns(), threading.get_native_id()))
            return f.value()

        return fut.then(done)

    def _record(self, bucket: Any, seq: int, t0: int, t1: int, fut: Any, model: int, half: bool) -> Any:
        """Records name buckets by number: each DDP model's bucket index, numbered in the order first seen (two models'
        bucket 0 are two buckets); the bytes are those on the wire (2 per element under a half-precision hook)."""
        index = self._bucket_ids.setdefault((model, bucket.index()), len(self._bucket_ids))
        buf = bucket.buffer()
        nbytes = buf.numel() * buf.element_size()
        wire = sparse_wire_bytes(buf, self.world) if buf.is_sparse else buf.numel() * 2 if half else nbytes
        self._records.append((Rec.ENQ_BEGIN, index, seq, t0, int(buf.is_sparse)))
        self._records.append((Rec.ENQ_END, index, seq, t1, wire))
        key = (nbytes, tuple(id(p) for p in bucket.parameters()))
        if self._layout_key.get(index) != key:
            self._layout_key[index] = key
            self._new_layout = True
        return self.on_done(fut, index, seq)

    def _layout(self) -> BucketLayout:
        return tuple(Bucket(i, nb, tuple(self._param_names.get(pid, "?") for pid in pids), tuple(self._param_shapes.get(pid) for pid in pids))
                     for i, (nb, pids) in sorted(self._layout_key.items()))


@dataclass
class _Registered:
    """The comm hook DDP runs inside dagprof's: the user's (``register_comm_hook``), else DDP's all-reduce."""

    hook: Callable
    state: Any
    half: bool = False  # torch's fp16/bf16 compression: 2 bytes per element on the wire
    own: bool = False  # a hook of the user's own: its collectives recorded per bucket call
    registered: bool = False  # the user registered one: DDP allows one


def hook_code(hook: Any) -> types.CodeType | None:
    """A comm hook's code: a function's, a functools.partial's function's, or a callable object's ``__call__``."""
    fn = getattr(hook, "func", hook)
    call = next((c.__dict__["__call__"] for c in type(fn).__mro__ if "__call__" in c.__dict__), None)  # an object's __call__
    return getattr(fn, "__code__", None) or getattr(call, "__code__", None)
