"""gloo's all-gather and reduce-scatter as FSDP2 calls them, swept over small sizes (needs torch): the wall time of each
call from a barrier's release to the slowest rank's return, per size, median and mean over every repetition, 2 gloo
ranks, no dagprof. ``bench/fsdp_host_costs.py`` fits its fixed cost per call as the intercept of a line through 4, 16
and 64 KiB; this shows whether a call's time is a line in its bytes there at all. Wall time: run it under the lock,
say the load.

    flock -x /tmp/dagprof-measure.lock torchrun --standalone --nproc-per-node 2 bench/fsdp_call_sizes.py [--iters 15 --rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
import torch.distributed as dist

from dagprof.collect.measure.calibrate import collective_op, timed_both
from dagprof.traces.comm_kind import CommKind

SIZES = (4096, 8192, 16384, 32768, 65536, 131072, 262144, 1 << 20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    for _ in range(3):
        dist.all_reduce(torch.ones(1024))
    reps: dict[str, dict[int, list[float]]] = {"all_gather": {}, "reduce_scatter": {}}
    for _ in range(args.rounds):  # every size in each round: the machine's load reaches all alike
        for kind in reps:
            for size in SIZES:
                make, moved = collective_op(CommKind.from_label(kind), size, world)
                wall = timed_both(make, args.iters)[0]
                reps[kind].setdefault(moved, []).extend(wall.max(axis=0).tolist())
    if dist.get_rank() == 0:
        out = {kind: {str(s): {"median_us": round(float(np.median(r)), 1), "mean_us": round(float(np.mean(r)), 1),
                               "p90_us": round(float(np.percentile(r, 90)), 1)} for s, r in sorted(by.items())} for kind, by in reps.items()}
        print(json.dumps({"torch": torch.__version__, "world": world, "load": os.getloadavg(), "slowest rank's call": out}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
