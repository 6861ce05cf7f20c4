"""``torch.nn.utils.clip_grad_norm_`` as the job calls it: one ``Rec.GRAD_CLIP`` record per call in the window.

The clip opens no ``record_function``, so in a profile it is unnamed compute between the backward and the optimizer
step. Under DDP it is local; under FSDP2 its norm over DTensor gradients is all-reduced in the shard group, blocking,
and each gradient goes through DTensor's dispatch: what ``passes.data_parallel`` adds where a DDP profile recorded the
calls. The name is patched in ``torch.nn.utils`` and ``torch.nn.utils.clip_grad`` for the window only (the collector's
``_restore`` undoes it); a script that bound the function by name before the window began is not seen.
"""
from __future__ import annotations

import time
from functools import wraps
from typing import Any

from ...traces.run_schema import Rec


def patch_grad_clip(collector: Any) -> None:
    """Record each call's gradient tensors and time (``Rec.GRAD_CLIP``) while ``collector`` records."""
    import torch.nn.utils as utils
    from torch.nn.utils import clip_grad

    original = clip_grad.clip_grad_norm_

    @wraps(original)
    def clip_grad_norm_(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        if not collector.recording:
            return original(parameters, *args, **kwargs)
        import torch

        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        t0 = time.time_ns()
        out = original(params, *args, **kwargs)
        try:
            collector.records.append((Rec.GRAD_CLIP, sum(p.grad is not None for p in params), 0, t0, time.time_ns() - t0))
        except Exception as err:  # noqa: BLE001
            collector._fail(err, "torch.nn.utils.clip_grad_norm_")
        return out

    for module in (utils, clip_grad):
        if module.__dict__.get("clip_grad_norm_") is original:
            module.clip_grad_norm_ = clip_grad_norm_
            collector._restore.append(lambda module=module: setattr(module, "clip_grad_norm_", original))
