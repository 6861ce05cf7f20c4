"""The bytes of the collectives a DDP model calls itself inside its ops (a loss's differentiable ``all_gather`` and the
scatters of its backward, a synchronised BatchNorm's statistics), so that link what-ifs can re-price them.

Kineto records no sizes without ``record_shapes`` (+70..100 % on small CPU ops), and these calls run inside the
model's ops where no hook sees them. So during the window (and only then) the ``torch.distributed`` functions they go
through are patched to write one ``Rec.OWN_COLL`` record per blocking call: kind, group size, bytes per rank (the
tensor Kineto's ``Input Dims`` would give). Calls with ``async_op=True`` are not recorded: DDP's comm hook issues its
buckets so, and an asynchronous call does not block the op that issued it. The reader matches the records to Kineto's
transfers by kind in issue order (``traces.run_comm``). Internal calls between c10d's own functions do not go through
the patched attributes, so each call of the model is counted once (FSDP's recorder patches the same names for its own
collectives; this one stays off there).
"""
from __future__ import annotations

import inspect
import time
from functools import wraps
from typing import Any

from ...traces.run_schema import OWN_KINDS, Rec

# torch.distributed function -> (kind, the argument holding the per-rank tensor)
OWN_CALLS = {
    "all_gather": ("allgather", "tensor"),
    "all_gather_into_tensor": ("allgather", "input_tensor"),
    "all_gather_single": ("allgather", "input_tensor"),
    "all_reduce": ("allreduce", "tensor"),
    "scatter": ("scatter", "tensor"),
    "gather": ("gather", "tensor"),
    "broadcast": ("broadcast", "tensor"),
}


def patch_own_collectives(collector: Any) -> None:
    """Patch ``torch.distributed``'s collectives for the window; the collector's ``_restore`` undoes it."""
    import torch.distributed as dist

    for name, (kind, arg) in OWN_CALLS.items():
        original = dist.__dict__.get(name)
        if original is None:
            continue
        setattr(dist, name, _recording(collector, original, OWN_KINDS.index(kind), arg))
        collector._restore.append(lambda name=name, original=original: setattr(dist, name, original))


def _recording(collector: Any, fn: Any, kind: int, arg: str) -> Any:
    signature = inspect.signature(fn)

    @wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if collector.recording:
            try:
                given = signature.bind(*args, **kwargs).arguments
                if not given.get("async_op", False):
                    import torch.distributed as dist

                    tensor = given[arg]
                    collector.records.append((Rec.OWN_COLL, kind, dist.get_world_size(given.get("group")), time.time_ns(),
                                              tensor.numel() * tensor.element_size()))
            except Exception as err:  # noqa: BLE001
                collector._fail(err, f"torch.distributed.{fn.__name__} (the model's own collective)")
        return fn(*args, **kwargs)
    return call
