"""FSDP2's host work per unit and gloo's fixed cost per blocking call, per torch version (needs torch): what a DDP profile
never ran, for ``costmodel.fsdp_costs.FSDP_HOST``.

Per unit (``collect.measure.calibrate.unit_extra``, the units ``dagprof calibrate --fsdp`` times, here of 1 and 4
``Linear`` tensors and of 16 KiB and 2 MiB): a stack of ``fully_shard`` units' forward and backward against the same stack
unsharded, less its all-gathers and reduce-scatters, in the training thread's CPU time (FSDP2's pre/post-forward and
backward hooks, the all-gather's copy-in, the reduce-scatter's copy-in and the gradient views, the reshard frees; a
wait for a core or a peer takes no CPU, so the figure holds on a shared machine), less FSDP2's copy-out
(``split_with_sizes_copy`` of the gathered bytes into new storage, timed on its own in CPU time: the conversion prices
each copy-out apart), fitted per unit, per tensor and per byte. Per call: gloo's all-gather and reduce-scatter as
FSDP2 calls them (``calibrate.collective_op``) at 4-64 KiB, the slowest rank's wall time each repetition from a barrier's
release, fitted over the bytes: the intercept is the call's fixed cost (the hand-offs between the ranks' threads and
gloo's, which a DDP profile's few all-reduces of one bucket size cannot split from their bytes). Wall time: run it on a
quiet machine, under the lock:

    flock /tmp/dagprof-measure.lock torchrun --standalone --nproc-per-node 2 bench/fsdp_host_costs.py [--iters 15 --rounds 3]
"""
from __future__ import annotations

import argparse
import gc
import json
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from dagprof.collect.measure.calibrate import collective_op, slowest_each, timed_both, unit_extra
from dagprof.traces.comm_kind import CommKind

SHAPES = ((8, 1, 64), (8, 4, 64), (4, 1, 724))  # (units, tensors a unit, width): the per-unit, per-tensor and per-byte terms
CALL_SIZES = (4096, 16384, 65536)  # bytes of the gathered tensor: small, so the intercept is the call's, not the wire's
COPY_SIZES = (1 << 20, 4 << 20)


def copy_out_cpu_per_byte(world: int, iters: int) -> float:
    """FSDP2's copy-out (``measure_fsdp``'s ``split_with_sizes_copy`` into four new parameters) in CPU us per gathered byte."""
    points = []
    for nbytes in COPY_SIZES:
        shard = nbytes // 4 // world // 4
        gathered = torch.ones(world, 4 * shard)

        def make() -> object:
            outs = [torch.empty(world, shard) for _ in range(4)]
            return lambda: torch.split_with_sizes_copy(gathered, [shard] * 4, dim=1, out=outs)
        points.append((world * 4 * shard * 4, float(np.median(timed_both(make, iters)[1]))))
    (m0, t0), (m1, t1) = points
    return max((t1 - t0) / (m1 - m0), 0.0)


def fit3(rows: list[tuple[int, int, float]]) -> list[float]:
    """(per unit, per tensor, per byte) us by least squares over (tensors, bytes, us); a term that comes out negative
    (noise) is dropped and the rest fitted again."""
    a = np.array([[1.0, t, b] for t, b, _ in rows])
    y = np.array([u for _, _, u in rows])
    keep = [0, 1, 2]
    while True:
        coef = np.linalg.lstsq(a[:, keep], y, rcond=None)[0]
        if (coef >= 0).all() or len(keep) == 1:
            out = [0.0, 0.0, 0.0]
            for k, c in zip(keep, coef):
                out[k] = max(float(c), 0.0)
            return out
        keep.pop(int(np.argmin(coef)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=15, help="timed repetitions per shape")
    ap.add_argument("--rounds", type=int, default=3, help="sweeps of every shape, pooled into one fit each")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    for _ in range(3):
        dist.all_reduce(torch.ones(1024))
    units: dict[str, list[tuple[int, int, float]]] = {"forward": [], "backward": []}
    calls: dict[str, list[tuple[int, float]]] = {"all_gather": [], "reduce_scatter": []}
    reps: dict[str, dict[int, list[float]]] = {kind: {} for kind in calls}  # every repetition's slowest rank, us
    copy = []
    for _ in range(args.rounds):
        copy.append(copy_out_cpu_per_byte(world, args.iters))
        for count, tensors, width in SHAPES:
            nbytes, _, _, timed = unit_extra(count, width, world, mesh, args.iters, per_unit=tensors)
            for phase, us in zip(units, timed["cpu_us"]):
                units[phase].append((tensors, nbytes, us))
        for kind in calls:
            for size in CALL_SIZES:
                make, moved = collective_op(CommKind.from_label(kind), size, world)
                wall = timed_both(make, args.iters)[0]
                calls[kind].append((moved, slowest_each(wall)))
                reps[kind].setdefault(moved, []).extend(wall.max(axis=0).tolist())
        gc.collect()
    per_byte = float(np.median(copy))
    # the copy-out is priced on its own: its CPU per byte comes off each phase's (each unit gathers once a phase)
    fits = {phase: fit3([(t, b, us - per_byte * b) for t, b, us in rows]) for phase, rows in units.items()}
    # each size's median over the rounds (a repetition descheduled on a shared machine took 9x), then the line's intercept
    medians = {kind: [(size, float(np.median([us for s, us in p if s == size]))) for size in sorted({s for s, _ in p})] for kind, p in calls.items()}
    call = {kind: max(float(np.polyfit(*np.array(p, dtype=float).T, 1)[1]), 0.0) for kind, p in medians.items()}
    # a job's blocking calls run one after another, so it pays their mean, tail included (a reduce-scatter's rare 2-3 ms
    # repetitions move no median): each size's mean over every repetition, and that line's intercept
    means = {kind: [(size, float(np.mean(r))) for size, r in sorted(by.items())] for kind, by in reps.items()}
    call_mean = {kind: max(float(np.polyfit(*np.array(p, dtype=float).T, 1)[1]), 0.0) for kind, p in means.items()}
    if dist.get_rank() == 0:
        print(json.dumps({"torch": torch.__version__, "world": world, "load": os.getloadavg(), "unit_points": units,
                          "copy_out_cpu_us_per_byte": per_byte, "call_points": calls, "call_medians": medians,
                          "unit_fits (per unit, per tensor, per byte)": fits, "call_us": call,
                          "call_means": means, "call_mean_us": call_mean}))
    del mesh
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
