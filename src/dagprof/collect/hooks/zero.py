"""ZeRO-1 (``torch.distributed.optim.ZeroRedundancyOptimizer``): what its step shards and broadcasts.

Its ``step()`` steps a local optimizer on the parameters this rank owns, then each owner broadcasts its parameters
(``_sync_params``: by owner rank, then one ``broadcast`` per parameter, or one per owner's bucket with
``parameters_as_bucket_view``), all in flight and waited for before ``step()`` returns. Kineto sees those broadcasts
without their sizes; ``zero_info`` gives them, in issue order, so the readers can price them as the model's bytes.
"""
from __future__ import annotations

import sys
from typing import Any

from ...traces.run_schema import ZeroInfo


def zero_info(opt: Any, rank: int) -> tuple[ZeroInfo | None, str]:
    """(what ``opt`` shards and broadcasts, or None where it is no ZeroRedundancyOptimizer; a warning, or "")."""
    # a job with one has imported it; importing it here would script torch's functional optimizers in every other job
    module = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    if module is None or not isinstance(opt, module.ZeroRedundancyOptimizer):
        return None, ""
    if opt._overlap_with_ddp:
        return None, (f"rank {rank}: ZeroRedundancyOptimizer(overlap_with_ddp=True) broadcasts inside DDP's comm hook: its "
                      "broadcasts are not told apart from the all-reduces (not modelled)")
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
