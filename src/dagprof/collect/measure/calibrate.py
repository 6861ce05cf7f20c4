"""Measure collective times over message sizes on a live torch.distributed group (like nccl-tests): the
all-reduce, and FSDP2's all-gather and reduce-scatter (the calls it makes, on the job's backend), each with
how far apart the ranks finish; FSDP2's own costs that a DDP profile cannot show (``measure_fsdp``); and how much an
in-flight all-reduce slows compute (``overlap.measure_overlap``).

``sweep`` runs inside an initialised process group (torchrun, or the testbed's ranks);
``spawn_sweep`` starts ``world`` gloo ranks on this machine itself; ``live_sweep`` (``dagprof calibrate``)
picks one of the two. ``fit`` turns the points into the ring alpha-beta model that ``dagprof whatif
--link-model`` reads (one per kind: ``Topology.kinds``).
torch is imported lazily: this module is importable without it.
"""
from __future__ import annotations

import gc
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import msgspec
import numpy as np

from ...costmodel.alphabeta import AlphaBeta, fit_alpha_beta
from ...costmodel.fsdp_costs import FsdpCosts, StepFit
from ...costmodel.topology import allreduce_equivalent_factor, fit_sweep
from ...errors import DagprofError
from ...traces.events import CommKind
from .overlap import OVERLAP_BYTES, Overlap, measure_overlap

DEFAULT_SIZES = tuple(2**k for k in range(12, 25, 2))  # 4 KiB .. 16 MiB


KINDS = (CommKind.ALL_REDUCE, CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER)  # what FSDP2 calls: all_gather_single, reduce_scatter_single


@dataclass(frozen=True)
class KindSweep:
    """One collective kind's sweep: (bytes, us) per size and how far apart the ranks finish."""

    kind: CommKind
    points: list[tuple[int, float]]  # nbytes: the whole tensor (an all-gather's output, a reduce-scatter's input); us: slowest rank's median
    skew_us: list[float]  # per size: median over repetitions of the last rank's time minus the first's (barrier-aligned start)
    times_us: list[list[list[float]]]  # per size: every rank's time of every repetition (ranks x repetitions), what the median hides


def collective_op(kind: CommKind, nbytes: int, world: int) -> tuple[Callable[[], Callable[[], object]], int]:
    """(a maker of the call FSDP2 makes for ``kind`` on a tensor of ``nbytes``, fp32, divisible by the ranks; the bytes).

    As FSDP2 does, each all-gather writes into a new output tensor and each reduce-scatter reads a new input its
    caller has just written (both allocated outside the timed call): on CPU the first touch of new pages costs
    inside the collective (a 16 MiB all-gather: 15.3 -> 18.5 ms here, one run). DDP all-reduces its buckets in place: one buffer."""
    import torch
    import torch.distributed as dist

    numel = max(int(nbytes) // 4 // world, 1) * world
    if kind == CommKind.ALL_REDUCE:
        full = torch.ones(numel, dtype=torch.float32)
        return lambda: (lambda: dist.all_reduce(full)), numel * 4
    if kind == CommKind.ALL_GATHER:  # torch 2.13 names it all_gather_single (all_gather_into_tensor before)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        shard = torch.ones(numel // world, dtype=torch.float32)

        def make_gather() -> Callable[[], object]:
            out = torch.empty(numel, dtype=torch.float32)
            return lambda: gather(out, shard)
        return make_gather, numel * 4
    if kind == CommKind.REDUCE_SCATTER:
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

        def make_scatter() -> Callable[[], object]:
            out, full = torch.empty(numel // world, dtype=torch.float32), torch.ones(numel, dtype=torch.float32)
            return lambda: scatter(out, full)
        return make_scatter, numel * 4
    raise DagprofError(f"calibrate: unknown collective {kind.label!r}; use {', '.join(k.label for k in KINDS)}")


def sweep_kind(kind: CommKind, sizes: tuple[int, ...] = DEFAULT_SIZES, iters: int = 5, warmup: int = 2) -> KindSweep:
    """``kind`` over ``sizes``, every rank entering together (barrier). Each rank times every repetition from the
    barrier's release; the time is the slowest rank's median (a rank that entered late measures less than the
    collective took) and the skew the spread of the ranks' times per repetition (how much later the last rank got
    out than the first, the barrier's own release skew included; no clock is compared across ranks). FSDP's kinds
    (not the all-reduce): the median of each repetition's slowest rank (``slowest_each``), since which rank gets out last
    alternates: gloo's all-gather releases one of 2 ranks about half its transfer after the other, and a job of
    back-to-back collectives waits for that rank every time, where the slowest rank's median held the lag in some
    sweeps and not in others (4 MiB at 200 Mbit/s: 133 and 97 ms, skew 42 and 40 ms, in two sweeps)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise DagprofError("calibrate: no torch.distributed process group is initialised")
    world = dist.get_world_size()
    warm = torch.ones(1024)
    for _ in range(3):  # connections and buffers are set up lazily on first use
        dist.all_reduce(warm)
    points, skew, times = [], [], []
    for nbytes in sizes:
        make, moved = collective_op(kind, nbytes, world)
        per = _timed_together(make, iters, warmup)
        points.append((moved, float(np.median(per, axis=1).max()) if kind == CommKind.ALL_REDUCE else slowest_each(per)))
        skew.append(float(np.median(per.max(axis=0) - per.min(axis=0))))
        times.append(np.round(per, 1).tolist())
    return KindSweep(kind, points, skew, times)


def sweep(sizes: tuple[int, ...] = DEFAULT_SIZES, iters: int = 5, warmup: int = 2) -> list[tuple[int, float]]:
    """(nbytes, median us) per size: fp32 all-reduce (``sweep_kind``)."""
    return sweep_kind(CommKind.ALL_REDUCE, sizes, iters, warmup).points


def fit(points: list[tuple[int, float]], world: int, kind: CommKind = CommKind.ALL_REDUCE, backend: str = "gloo") -> AlphaBeta:
    """The link model of a sweep. The all-reduce's: ``costmodel.topology.fit_sweep`` (DDP's buckets are MBs). Another
    kind's: the link on which an all-reduce of its all-reduce-equivalent bytes costs what it measured (``Topology.kinds``),
    fitted to every size alike (relative residuals): FSDP units range from KBs to tens of MBs, and a new tensor's
    first-touch cost makes the largest sizes superlinear, which a slope over them alone would spread to every size."""
    m = np.array([p[0] for p in points], dtype=float) * allreduce_equivalent_factor(kind, backend)
    t = np.array([p[1] for p in points], dtype=float)
    return fit_sweep(m, t, world) if kind == CommKind.ALL_REDUCE else fit_alpha_beta(m, t, world, relative=True)


# (parameter tensors, width) of the models whose optimizer step is timed: many small tensors (the per-tensor cost)
# to few large ones (the per-byte cost); Linear(width, width) weights, 4 KiB to 4 MiB each
OPT_SHAPES = ((32, 32), (8, 256), (2, 1024))
COPY_SIZES = (1 << 20, 4 << 20, 16 << 20)  # bytes of the all-gather output a copy-out splits into parameters
UNITS = (8, 64)  # (units, width) of the stack whose forward and backward time FSDP2's cost per unit: small, so that
# what it measures is the per-unit cost, not the transfers'
LARGE_UNITS = (4, 724)  # and of units of 2 MiB (a transformer block of width 256 holds 3 MiB): how that cost grows with a unit's bytes


def _timed_together(make: Callable[[], Callable[[], object]], iters: int, warmup: int = 2) -> np.ndarray:
    """us, ranks x repetitions: every rank times ``make()``'s call from a barrier's release, as the ranks of a job
    run it side by side (``warmup`` repetitions first, untimed); every rank gets every rank's times."""
    return timed_both(make, iters, warmup)[0]


def timed_both(make: Callable[[], Callable[[], object]], iters: int, warmup: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """``_timed_together``'s wall times and the same calls' CPU time on the calling thread (what waiting on a peer or
    on the link does not take), us, ranks x repetitions each."""
    import torch
    import torch.distributed as dist

    times = []
    for i in range(warmup + iters):
        call = make()
        dist.barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        call()
        if i >= warmup:
            times.append(((time.perf_counter() - t0) * 1e6, (time.thread_time() - c0) * 1e6))
    mine = torch.tensor(times, dtype=torch.float64).T.contiguous()
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    both = torch.stack(every).numpy()
    return both[:, 0], both[:, 1]


def _slowest_median(make: Callable[[], Callable[[], object]], iters: int, warmup: int = 2) -> float:
    """us: the slowest rank's median of ``_timed_together``."""
    return float(np.median(_timed_together(make, iters, warmup), axis=1).max())


def slowest_each(per: np.ndarray) -> float:
    """us: the median over repetitions of the slowest rank's time (ranks x repetitions): what a job of back-to-back
    collectives waits for where the last rank out changes from one repetition to the next."""
    return float(np.median(per.max(axis=0)))


def measure_fsdp(iters: int = 5) -> tuple[FsdpCosts, dict]:
    """FSDP2's costs on this group (``costmodel.fsdp_costs``), and the timings they were fitted to.

    The optimizer: ``torch.optim.AdamW`` steps a stack of ``Linear`` weights (``OPT_SHAPES``) once as plain tensors (as DDP
    holds them) and once after ``fully_shard`` per layer and on the stack (DTensor shards, gradients from a real
    forward and backward), every rank stepping at once. The copy-out: FSDP2's ``split_with_sizes_copy`` of an
    all-gather's output (``world`` x shard) into four parameters' new storage (``COPY_SIZES``); DDP's bucket passes at
    the same sizes: four gradients scaled into one flat bucket allocated before (``mul`` with ``out=``, as DDP's
    reducer divides while it copies), and copied back. Per unit: the forward
    and the backward of a stack of ``UNITS`` ``Linear`` units, ``fully_shard`` each (resharded after forward), less the
    same stack unsharded and less its collectives at their own measured time (an all-gather per unit in forward, an
    all-gather and a reduce-scatter in backward), per unit; never below 0 (``unit_extra``). Then the same for
    ``LARGE_UNITS``: how much more a unit costs per byte of its parameters, in CPU time on the calling thread (first
    touch of the gathered parameters and gradients, FSDP's passes over them), less the copy-out's time per byte (the
    conversion prices each copy-out on its own), never below 0. In CPU time because the wall times of units of MBs
    hold their collectives, which on a shaped link are tens of ms and vary by more than the growth: at 200 Mbit/s two
    calibrations' wall-clock growth came out 6.2 and 24 ms per MB forward, the CPU's 0.65 (loopback 0.17; backward 2.0
    and 0.48). Measured on this machine (2 gloo ranks, loopback, load 5): CPU 0.5 and 0.7 ms more than the unsharded
    stack per 16 KiB unit (forward, backward), 0.6 and 0.9 ms per 256 KiB."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise DagprofError("calibrate: no torch.distributed process group is initialised")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    steps = optimizer_points(mesh, iters)
    copy = []
    for nbytes in COPY_SIZES:
        shard = max(nbytes // 4 // world // 4, 1)
        gathered = torch.ones(world, 4 * shard)

        def make_copy() -> Callable[[], object]:
            outs = [torch.empty(world, shard) for _ in range(4)]
            return lambda: torch.split_with_sizes_copy(gathered, [shard] * 4, dim=1, out=outs)
        copy.append((world * 4 * shard * 4, _slowest_median(make_copy, iters)))
    per_byte = _per_byte(copy)
    bucket_in, bucket_out = [], []
    for nbytes in COPY_SIZES:
        grads = [torch.ones(nbytes // 4 // 4) for _ in range(4)]
        flat = torch.zeros(nbytes // 4)
        views = list(flat.split([g.numel() for g in grads]))
        bucket_in.append((nbytes, _slowest_median(lambda: lambda: [torch.mul(g, 1.0 / world, out=v) for g, v in zip(grads, views)], iters)))
        bucket_out.append((nbytes, _slowest_median(lambda: lambda: [g.copy_(v) for g, v in zip(grads, views)], iters)))
    per_unit = [unit_extra(units, width, world, mesh, iters) for units, width in (UNITS, LARGE_UNITS)]
    del mesh
    gc.collect()  # the sharded modules and their mesh go while the group lives: left to its teardown, a rank aborted in 2 runs of 12 (0 of 27 so)
    dist.barrier()
    (small, f0, b0, cpu0), (large, _, _, cpu1) = per_unit
    growth = [max((x1 - x0) / (large - small) - per_byte, 0.0) for x0, x1 in zip(cpu0["cpu_us"], cpu1["cpu_us"])]  # beyond the copy-out's own
    costs = FsdpCosts(world, StepFit.fit(steps["plain"]), StepFit.fit(steps["dtensor"]), per_byte, f0, b0,
                      unit_forward_us_per_byte=growth[0], unit_backward_us_per_byte=growth[1],
                      bucket_in_us_per_byte=_per_byte(bucket_in), bucket_out_us_per_byte=_per_byte(bucket_out))
    return costs, {"optimizer_points": steps, "copy_out_points": copy, "bucket_in_points": bucket_in, "bucket_out_points": bucket_out,
                   "unit_points": [{"unit_bytes": nb, "forward_us": f, "backward_us": b, **rest} for nb, f, b, rest in per_unit]}


def optimizer_points(mesh: object, iters: int, cpu: bool = False) -> dict[str, list[tuple[int, int, float]]]:
    """(tensors, bytes, us) of ``torch.optim.AdamW``'s step on ``OPT_SHAPES``' stacks, ``plain`` (whole tensors, as DDP holds
    them) and ``dtensor`` (``fully_shard``'s shards on ``mesh``: bytes the shard's; gradients from a real forward and
    backward), every rank stepping at once: the slowest rank's median wall time (``measure_fsdp``, at the user's load), or
    with ``cpu`` its thread's CPU time, which waiting for a core does not take (``bench/dtensor_optimizer.py``: a constant
    per torch version, measured on a machine shared with other work)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    steps: dict[str, list[tuple[int, int, float]]] = {"plain": [], "dtensor": []}
    for tensors, width in OPT_SHAPES:
        for how in steps:
            model = _linear_stack(tensors, width, mesh if how == "dtensor" else None)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
            model(torch.ones(2, width)).sum().backward()
            nbytes = tensors * width * width * 4
            us = (float(np.median(timed_both(lambda step=opt.step: step, iters)[1], axis=1).max()) if cpu else
                  _slowest_median(lambda step=opt.step: step, iters))
            steps[how].append((tensors, nbytes // world if how == "dtensor" else nbytes, us))
            del model, opt
    gc.collect()  # the sharded modules go while the group lives (``measure_fsdp``)
    return steps


def _per_byte(points: list[tuple[int, float]]) -> float:
    """us per byte: the slope of (bytes, us), or the largest point's mean where noise makes the slope <= 0."""
    m, t = np.array(points, dtype=float).T
    slope = float(np.polyfit(m, t, 1)[0])
    return slope if slope > 0 else float(t[-1] / m[-1])


def _linear_stack(count: int, width: int, mesh: object | None, per_unit: int = 1):
    """``count`` units of ``per_unit`` bias-free ``Linear(width, width)`` layers each (one: the layer itself, more: a
    ``Sequential`` of them) in a ``Sequential`` (seeded alike on every rank); with ``mesh``, ``fully_shard`` on each unit
    and on the stack, as a user wraps a model of units."""
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    layers = [[nn.Linear(width, width, bias=False) for _ in range(per_unit)] for _ in range(count)]
    model = nn.Sequential(*[ls[0] if per_unit == 1 else nn.Sequential(*ls) for ls in layers])
    if mesh is not None:
        for unit in model:
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def unit_extra(units: int, width: int, world: int, mesh: object, iters: int, per_unit: int = 1) -> tuple[int, float, float, dict]:
    """(a unit's parameter bytes, its forward's and its backward's cost per unit beyond its collectives (never below 0), the
    timings): a stack of ``units`` units of ``per_unit`` ``Linear(width, width)`` layers, ``fully_shard`` each, against the
    same stack unsharded, less an all-gather per unit in forward, an all-gather and a reduce-scatter in backward at their
    own measured time (each timed as the sweep times FSDP's kinds, ``slowest_each``: the lag of the rank that gets out last is the collectives',
    not the unit's). The timings also hold the same differences in CPU time on the calling thread (``cpu_us``: forward,
    backward per unit), which no wait on the link or a peer enters."""
    import torch
    import torch.nn as nn

    wall, cpu = {}, {}
    for how in ("plain", "fsdp"):
        model = _linear_stack(units, width, mesh if how == "fsdp" else None, per_unit)
        x = torch.ones(8, width)

        def make_backward(model: nn.Module = model, x: torch.Tensor = x) -> Callable[[], object]:
            loss = model(x).sum()
            return loss.backward
        timed = [timed_both(make, iters) for make in (lambda model=model, x=x: lambda: model(x), make_backward)]
        wall[how] = [slowest_each(w) for w, _ in timed]
        cpu[how] = [float(np.median(c)) for _, c in timed]
    nbytes = per_unit * width * width * 4
    ops = [timed_both(collective_op(kind, nbytes, world)[0], iters) for kind in (CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER)]
    (gather, scatter), (gather_cpu, scatter_cpu) = [slowest_each(w) for w, _ in ops], [float(np.median(c)) for _, c in ops]
    forward = max((wall["fsdp"][0] - wall["plain"][0]) / units - gather, 0.0)
    backward = max((wall["fsdp"][1] - wall["plain"][1]) / units - gather - scatter, 0.0)
    cpu_us = [(cpu["fsdp"][0] - cpu["plain"][0]) / units - gather_cpu, (cpu["fsdp"][1] - cpu["plain"][1]) / units - gather_cpu - scatter_cpu]
    return nbytes, forward, backward, {"passes_us": wall, "collectives_us": [gather, scatter], "cpu_us": cpu_us}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sweeps(sizes: tuple[int, ...], iters: int, kinds: tuple[CommKind, ...], fsdp: bool,
            overlap: bool, overlap_bytes: int = OVERLAP_BYTES) -> tuple[list[KindSweep], tuple[FsdpCosts, dict] | None, Overlap | None]:
    return ([sweep_kind(k, sizes, iters) for k in kinds], measure_fsdp(iters) if fsdp else None,
            measure_overlap(overlap_bytes) if overlap else None)


def _worker(rank: int, world: int, port: int, sizes: tuple[int, ...], iters: int, kinds: tuple[CommKind, ...], fsdp: bool, overlap: bool,
            overlap_bytes: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        sweeps, costs, slowed = _sweeps(sizes, iters, kinds, fsdp, overlap, overlap_bytes)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"sweeps": [{"kind": s.kind.label, "points": s.points, "skew_us": s.skew_us, "times_us": s.times_us} for s in sweeps],
                       "fsdp": None if costs is None else [costs[0].to_dict(), costs[1]],
                       "overlap": msgspec.to_builtins(slowed)}, f)


def spawn_sweep(world: int = 2, sizes: tuple[int, ...] = DEFAULT_SIZES, iters: int = 5, kinds: tuple[CommKind, ...] = (CommKind.ALL_REDUCE,),
                fsdp: bool = False, overlap: bool = False,
                overlap_bytes: int = OVERLAP_BYTES) -> tuple[list[KindSweep], tuple[FsdpCosts, dict] | None, Overlap | None]:
    """Start ``world`` gloo ranks on this machine (loopback), sweep each of ``kinds`` and, with ``fsdp``, ``measure_fsdp``;
    with ``overlap``, ``measure_overlap`` beside an all-reduce of ``overlap_bytes``."""
    if world < 2:
        raise DagprofError(f"calibrate needs at least 2 ranks, got {world}")
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="dagprof-calibrate-") as tmp:
        out = os.path.join(tmp, "points.json")
        mp.spawn(_worker, args=(world, _free_port(), tuple(sizes), iters, tuple(kinds), fsdp, overlap, overlap_bytes, out), nprocs=world, join=True)
        with open(out) as f:
            doc = json.load(f)
    sweeps = [KindSweep(CommKind.from_label(d["kind"]), [(int(m), float(t)) for m, t in d["points"]], d["skew_us"], d["times_us"]) for d in doc["sweeps"]]
    return (sweeps, None if doc["fsdp"] is None else (FsdpCosts.from_dict(doc["fsdp"][0]), doc["fsdp"][1]),
            None if doc["overlap"] is None else msgspec.convert(doc["overlap"], Overlap))


@dataclass(frozen=True)
class LiveSweep:
    world: int
    rank: int  # this process's rank in the group that measured (rank 0 writes the result)
    sweeps: list[KindSweep]  # the all-reduce's first
    fsdp: tuple[FsdpCosts, dict] | None = None  # ``measure_fsdp``'s costs and timings, where asked for
    overlap: Overlap | None = None  # ``measure_overlap`` on the group, where asked for

    @property
    def points(self) -> list[tuple[int, float]]:
        """The all-reduce sweep's (nbytes, us)."""
        return self.sweeps[0].points


def live_sweep(world: int, sizes: tuple[int, ...] = DEFAULT_SIZES, iters: int = 5, kinds: tuple[CommKind, ...] = (CommKind.ALL_REDUCE,),
               fsdp: bool = False, overlap: bool = False, overlap_bytes: int = OVERLAP_BYTES) -> LiveSweep:
    """Inside a torch.distributed job (RANK and WORLD_SIZE set, as torchrun does): join its group (gloo) and
    sweep there; else start ``world`` gloo ranks on this machine (``spawn_sweep``). The all-reduce is always
    swept, first (the link model's own link); ``fsdp``: FSDP2's own costs measured after (``measure_fsdp``); ``overlap``: the
    compute slowdown beside an in-flight all-reduce of ``overlap_bytes`` (``measure_overlap``), last."""
    kinds = (CommKind.ALL_REDUCE, *(k for k in kinds if k != CommKind.ALL_REDUCE))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            return LiveSweep(dist.get_world_size(), dist.get_rank(), *_sweeps(sizes, iters, kinds, fsdp, overlap, overlap_bytes))
        finally:
            dist.destroy_process_group()
    return LiveSweep(world, 0, *spawn_sweep(world, sizes, iters, kinds, fsdp, overlap, overlap_bytes))
