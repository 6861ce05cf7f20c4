"""FSDP2's optimizer step on DTensor shards against the same step on plain whole tensors, per torch version (needs torch).

A DDP profile times the optimizer on plain tensors; FSDP2 steps it on DTensor shards, each op dispatched through
DTensor's sharding layer: a fixed cost per tensor far above a plain op's, which no DDP profile shows. This times
``torch.optim.AdamW``'s step on both (``collect.measure.calibrate.optimizer_points``: the shapes ``dagprof calibrate
--fsdp`` times, every rank stepping at once) in the stepping thread's CPU time, not wall time: on a machine shared
with other work the wall times of DTensor's longer step gained more waits for a core (its ratio to the plain step
moved from 14 to 20 between runs minutes apart at load 2-3), and a profile's own step already holds its load's waits.
It prints the two fits (``costmodel.fsdp_costs.StepFit``) for ``costmodel.fsdp_costs.DTENSOR_STEP`` under the torch
version: the DDP -> FSDP conversion without a calibrated file scales the profile's own optimizer step by their ratio
at the job's tensors and bytes. Run it under the lock:

    flock /tmp/dagprof-measure.lock torchrun --standalone --nproc-per-node 2 bench/dtensor_optimizer.py [--iters 9 --rounds 3]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from dagprof.collect.measure.calibrate import optimizer_points
from dagprof.costmodel.fsdp_costs import StepFit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=9, help="timed repetitions per shape (the slowest rank's median)")
    ap.add_argument("--rounds", type=int, default=3, help="sweeps of every shape, their points pooled into one fit each")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    points: dict[str, list[tuple[int, int, float]]] = {"plain": [], "dtensor": []}
    for _ in range(args.rounds):
        for how, p in optimizer_points(mesh, args.iters, cpu=True).items():
            points[how] += p
    if dist.get_rank() == 0:
        fits = {how: StepFit.fit(p) for how, p in points.items()}
        print(json.dumps({"torch": torch.__version__, "world": dist.get_world_size(), "points": points,
                          "fits": {how: vars(f) for how, f in fits.items()}}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
