"""What every job in bench/tp_fresh shares: the process group, the step loop, an optional stock torch.profiler export.

Each job runs under ``torchrun`` (``dagprof profile -- torchrun ...`` profiles it zero-code) or, with ``--trace DIR``,
exports one stock Kineto JSON per rank of steps 2-3 as a user brings them (``torch.profiler`` with
``tensorboard_trace_handler``), without dagprof in the process.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import torch
import torch.distributed as dist


def parse(doc: str, **extra) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--trace", help="export stock torch.profiler traces (steps 2-3) into this folder")
    for flag, (kind, default) in extra.items():
        p.add_argument("--" + flag.replace("_", "-"), type=kind, default=default)
    return p.parse_args()


def init() -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    return dist.get_rank()


def loop(args: argparse.Namespace, step: Callable[[], None]) -> None:
    """``args.steps`` training steps; under ``--trace`` a profiler with wait 1, warmup 1, active 2."""
    prof = None if not args.trace else torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(args.trace, worker_name=f"rank-{dist.get_rank()}"))
    if prof is not None:
        os.makedirs(args.trace, exist_ok=True)
        prof.start()
    for _ in range(args.steps):
        step()
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
    dist.barrier()
    dist.destroy_process_group()
