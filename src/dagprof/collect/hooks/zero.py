"""ZeRO-1 (``torch.distributed.optim.ZeroRedundancyOptimizer``): what its step shards and broadcasts.

Its ``step()`` steps a local optimizer on the parameters this rank owns, then each owner broadcasts its parameters
(``_sync_params``: by owner rank, then one ``broadcast`` per parameter, or one per owner's bucket with
``parameters_as_bucket_view``), all in flight and waited for before ``step()`` returns. Kineto sees those broadcasts
without their sizes; ``zero_info`` gives them, in issue order, so the readers can price them as the model's bytes.
With ``overlap_with_ddp=True`` DDP's comm hook steps it instead, inside backward: ``ZeroOverlap`` records that.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from ...traces.run_schema import Rec, ZeroInfo


def zero_info(opt: Any, rank: int) -> tuple[ZeroInfo | None, str]:
    """(what ``opt`` shards and broadcasts, or None where it is no ZeroRedundancyOptimizer; a warning, or "")."""
    # a job with one has imported it; importing it here would script torch's functional optimizers in every other job
    module = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    if module is None or not isinstance(opt, module.ZeroRedundancyOptimizer):
        return None, ""
    if opt._overlap_with_ddp:  # its step() does nothing: DDP's comm hook steps it (ZeroOverlap)
        return None, ""
    owners, nbytes = [], []
    for owner, groups in enumerate(opt._partition_parameters()):
        sizes = [p.numel() * p.element_size() for g in groups for p in g["params"] if p.requires_grad or not opt.parameters_as_bucket_view]
        if opt.parameters_as_bucket_view:
            sizes = [sum(sizes)] if sizes else []
        owners += [owner] * len(sizes)
        nbytes += sizes
    mine = sum(n for o, n in zip(owners, nbytes) if o == opt.rank)
    return ZeroInfo(optimizer=type(opt.optim).__name__, world_size=int(opt.world_size), owners=owners, nbytes=nbytes,
                    owned_bytes=mine), ""


OVERLAP_HOOK = "hook_with_zero_step.<locals>.hook_with_zero_fn"  # ddp_zero_hook's function that DDP's comm hook calls
INTERLEAVED_HOOK = "hook_with_zero_step_interleaved.<locals>.hook_with_zero_interleaved_fn"


class ZeroOverlap:
    """``ZeroRedundancyOptimizer(overlap_with_ddp=True)`` stepped by ``hook_with_zero_step``: what its step did, per bucket.

    When the last gradient bucket's hook has issued its all-reduce, the hook walks the buckets in order: for one this rank
    owns it waits for the all-reduce and steps its shard (``_perform_local_step``), then it broadcasts the bucket from its
    owner (``_broadcast_bucket``), and at the end waits for every broadcast (``wait_for_broadcasts``), all on the thread
    running backward. Those three are wrapped (the module's functions, found by name at each call, and this optimizer's
    ``_overlap_info`` method) to record each as it runs; a broadcast is numbered by the comm hook's ``seq`` (every rank
    issues all-reduces and broadcasts in one order) and completed by its work's future. Nothing is recorded outside the
    window, nor for the first iterations, before DDP's buckets are final and the hook steps nothing.
    """

    def __init__(self, zero: Any, buckets: Any, inner: Any) -> None:
        self.zero = zero
        self.name = f"{OVERLAP_HOOK.split('.')[0]}({getattr(inner, '__name__', type(inner).__name__)})"  # the comm hook, as the rank file names it
        self._buckets = buckets  # the comm hook's records, seq numbers, window and guard (ddp_buckets.DdpBuckets)
        self.stepped = False  # the hook stepped in the window (its owners and sizes are known then)

    @staticmethod
    def of(hook: Any, buckets: Any) -> ZeroOverlap | None:
        """The recorder for ``hook`` where it is ``hook_with_zero_step``'s (installed), else None; a warning for the
        interleaved variant, whose steps run in the all-reduces' callbacks on gloo's threads (not modelled)."""
        name = getattr(hook, "__qualname__", "")
        if name == INTERLEAVED_HOOK:
            buckets.warn("hook_with_zero_step_interleaved steps ZeroRedundancyOptimizer in the all-reduces' callbacks: its "
                         "steps and broadcasts are not recorded (not modelled); they count as communication time")
        if name != OVERLAP_HOOK:
            return None
        free = dict(zip(hook.__code__.co_freevars, (c.cell_contents for c in hook.__closure__ or ())))
        zero = free.get("zero")
        if zero is None or zero._overlap_info.shard_buckets:
            buckets.warn("hook_with_zero_step(shard_buckets=True) splits buckets between owners: ZeroRedundancyOptimizer's "
                         "overlapped steps and broadcasts are not recorded (not modelled)")
            return None
        recorder = ZeroOverlap(zero, buckets, free.get("hook"))
        recorder._install()
        return recorder

    def _install(self) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import ddp_zero_hook as module

        setup, local_step, broadcast = module._hook_with_zero_step_setup, module._perform_local_step, module._broadcast_bucket
        info, me = self.zero._overlap_info, self
        wait = info.wait_for_broadcasts

        def _hook_with_zero_step_setup(ddp_ref: Any, zero: Any, bucket: Any) -> None:
            me._buckets.issued_at = time.time_ns()  # the bucket's all-reduce is issued: the comm hook's span ends here
            setup(ddp_ref, zero, bucket)

        def _perform_local_step(bucket: Any, zero: Any, rank: int) -> None:
            if zero is not me.zero or not me._buckets.recording():
                return local_step(bucket, zero, rank)
            me._guarded(lambda: me._mark(Rec.ZERO_STEP_BEGIN, bucket.index()))
            local_step(bucket, zero, rank)
            me._guarded(lambda: me._mark(Rec.ZERO_STEP_END, bucket.index()))

        def _broadcast_bucket(bucket_index: int, zero: Any) -> None:
            if zero is not me.zero or not me._buckets.recording():
                return broadcast(bucket_index, zero)
            begun = me._guarded(lambda: me._broadcast_begins(bucket_index, zero))
            broadcast(bucket_index, zero)
            if begun is not None:
                me._guarded(lambda: me._broadcast_ends(bucket_index, zero, *begun))

        def wait_for_broadcasts() -> None:
            if not me._buckets.recording():
                return wait()
            me._guarded(lambda: me._mark(Rec.ZERO_WAIT_BEGIN))
            wait()
            me._guarded(lambda: me._mark(Rec.ZERO_WAIT_END))

        module._hook_with_zero_step_setup, module._perform_local_step = _hook_with_zero_step_setup, _perform_local_step
        module._broadcast_bucket, info.wait_for_broadcasts = _broadcast_bucket, wait_for_broadcasts

    def _broadcast_begins(self, index: int, zero: Any) -> tuple[int, int]:
        """(seq, owner) of the bucket's broadcast, its start recorded."""
        self.stepped = True
        owner = min(zero._overlap_info.assigned_ranks_per_bucket[index])  # one each (shard_buckets=False)
        seq = self._buckets.next_seq()
        self._mark(Rec.ZERO_BCAST_BEGIN, index, seq, owner)
        return seq, owner

    def _broadcast_ends(self, index: int, zero: Any, seq: int, owner: int) -> None:
        tensor = zero._bucket_assignments_per_rank[owner][index].tensor
        self._mark(Rec.ZERO_BCAST_END, index, seq, tensor.numel() * tensor.element_size())
        self._buckets.on_done(zero._overlap_info.broadcast_handles[-1].get_future(), index, seq)

    def _guarded(self, record: Any) -> Any:
        """``record()``, or None where it failed: profiling stops (torch's private ZeRO fields may differ in the user's
        torch), the user's step and broadcast go on."""
        try:
            return record()
        except Exception as err:  # noqa: BLE001
            self._buckets.fail(err, "ZeroRedundancyOptimizer's overlapped step")
            return None

    def _mark(self, code: Rec, a: int = 0, b: int = 0, x: int = 0) -> None:
        self._buckets.append((code, a, b, time.time_ns(), x))

    def info(self, profiled: bool) -> ZeroInfo | None:
        """Its buckets' owners and broadcast sizes, in the hook's order; None, and a warning where steps were
        ``profiled``, if it never stepped in the window."""
        if not self.stepped:
            if profiled:
                self._buckets.warn(f"rank {self.zero.global_rank}: ZeroRedundancyOptimizer(overlap_with_ddp=True) did not step in the "
                                   "profiled steps (its first iterations learn DDP's buckets): profile later steps (--steps)")
            return None
        zero = self.zero
        per_rank = zero._bucket_assignments_per_rank
        buckets = range(len(zero._overlap_info.assigned_ranks_per_bucket))
        owners = [min(zero._overlap_info.assigned_ranks_per_bucket[b]) for b in buckets]
        nbytes = [per_rank[o][b].tensor.numel() * per_rank[o][b].tensor.element_size() for b, o in zip(buckets, owners)]
        return ZeroInfo(optimizer=type(zero.optim).__name__.lstrip("_").replace("Functional", ""), world_size=int(zero.world_size),
                        owners=owners, nbytes=nbytes, owned_bytes=sum(n for o, n in zip(owners, nbytes) if o == zero.rank),
                        buckets=list(buckets))
