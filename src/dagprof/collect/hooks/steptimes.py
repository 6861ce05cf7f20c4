"""Step times of an unprofiled run, one small JSON file per rank: what ``--verify`` and the demo measure.

A step is one optimizer step; with gradient accumulation it holds several micro-batches
(forward calls of the DDP model), and the figure compared across configurations is the time
per micro-batch, so a strategy that changes the effective batch is compared per sample.
"""
from __future__ import annotations

import json
import os
import statistics

from ...errors import DagprofError
from ...fsutil import atomic_open

WARMUP_FRACTION = 1 / 3  # steps skipped at the start: DDP's bucket rebuild, PowerSGD's start, allocator warm-up


def write_times(folder: str, rank: int, step_s: list[float], micro_batches: list[int] | int = 1) -> str:
    mb = micro_batches if isinstance(micro_batches, list) else [micro_batches] * len(step_s)
    path = os.path.join(folder, f"rank{rank}.json")
    with atomic_open(path) as f:
        json.dump({"rank": rank, "step_s": step_s, "micro_batches": mb}, f)
    return path


def read_times(folder: str) -> list[dict]:
    files = sorted(f for f in os.listdir(folder) if f.startswith("rank") and f.endswith(".json")) if os.path.isdir(folder) else []
    if not files:
        raise DagprofError("the job wrote no step times (did it train a DistributedDataParallel model with an optimizer?)", folder)
    out = []
    for f in files:
        with open(os.path.join(folder, f)) as fh:
            out.append(json.load(fh))
    return out


def iteration_ms(per_rank: list[dict]) -> float:
    """Median over steps (after warm-up) of the slowest rank's step time per micro-batch, in ms."""
    steps = min(len(t["step_s"]) for t in per_rank)
    if steps == 0:
        raise DagprofError("the job finished no training step")
    skip = min(int(steps * WARMUP_FRACTION), steps - 1)
    per_step = [max(t["step_s"][i] / max(t["micro_batches"][i], 1) for t in per_rank) for i in range(skip, steps)]
    return 1e3 * statistics.median(per_step)
