"""Measure all-reduce time over message sizes on a live torch.distributed group (like nccl-tests).

``sweep`` runs inside an initialised process group (torchrun, or the testbed's ranks);
``spawn_sweep`` starts ``world`` gloo ranks on this machine itself; ``live_sweep`` (``dagprof calibrate``)
picks one of the two. ``fit`` turns the points into the ring alpha-beta model that ``dagprof whatif
--link-model`` reads.
torch is imported lazily: this module is importable without it.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from ...costmodel.alphabeta import AlphaBeta
from ...costmodel.topology import fit_sweep
from ...errors import DagprofError

DEFAULT_SIZES = tuple(2**k for k in range(12, 25, 2))  # 4 KiB .. 16 MiB


def sweep(sizes: tuple[int, ...] = DEFAULT_SIZES, iters: int = 5, warmup: int = 2) -> list[tuple[int, float]]:
    """(nbytes, median us) per size: fp32 all-reduce, every rank entering together (barrier)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise DagprofError("calibrate: no torch.distributed process group is initialised")
    out = []
    warm = torch.ones(1024)
    for _ in range(3):  # connections and buffers are set up lazily on first use
        dist.all_reduce(warm)
    for nbytes in sizes:
        buf = torch.ones(max(int(nbytes) // 4, 1), dtype=torch.float32)
        times = []
        for i in range(warmup + iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e6)
        # the slowest rank's view: a rank that entered late measures less than the collective took
        t = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out.append((buf.numel() * 4, float(t.item())))
    return out


def fit(points: list[tuple[int, float]], world: int) -> AlphaBeta:
    """The link model of a sweep (``costmodel.topology.fit_sweep``)."""
    m = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    return fit_sweep(m, t, world)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, sizes: tuple[int, ...], iters: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        points = sweep(sizes, iters)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(points, f)


def spawn_sweep(world: int = 2, sizes: tuple[int, ...] = DEFAULT_SIZES, iters: int = 5) -> list[tuple[int, float]]:
    """Start ``world`` gloo ranks on this machine (loopback) and sweep."""
    if world < 2:
        raise DagprofError(f"calibrate needs at least 2 ranks, got {world}")
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="dagprof-calibrate-") as tmp:
        out = os.path.join(tmp, "points.json")
        mp.spawn(_worker, args=(world, _free_port(), tuple(sizes), iters, out), nprocs=world, join=True)
        with open(out) as f:
            return [(int(m), float(t)) for m, t in json.load(f)]


@dataclass(frozen=True)
class LiveSweep:
    world: int
    rank: int  # this process's rank in the group that measured (rank 0 writes the result)
    points: list[tuple[int, float]]  # (nbytes, us)


def live_sweep(world: int, sizes: tuple[int, ...] = DEFAULT_SIZES, iters: int = 5) -> LiveSweep:
    """Inside a torch.distributed job (RANK and WORLD_SIZE set, as torchrun does): join its group (gloo) and
    sweep there; else start ``world`` gloo ranks on this machine (``spawn_sweep``)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            return LiveSweep(dist.get_world_size(), dist.get_rank(), sweep(sizes, iters))
        finally:
            dist.destroy_process_group()
    return LiveSweep(world, 0, spawn_sweep(world, sizes, iters))
