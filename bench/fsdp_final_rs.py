"""The reduce-scatters FSDP2 issues from its final backward callback (needs torch): a unit whose forward inputs need no
gradient (the first trained block behind a frozen stem or frozen blocks, as in ``fsdp_fresh/mixer_frozen.py`` and the LoRA
fine-tune) never runs its post-backward hook, so ``_root_post_backward_final_callback`` reduce-scatters it after the root.
In the kept FSDP2 profiles of those jobs that last call returned 3-10 ms after its transfer ended, each step, where the
other reduce-scatters returned 0.3-1.4 ms after theirs. This times each of FSDP2's reduce-scatter calls from the later
rank's issue to the ranks' return (mean; the earlier rank's wait for its peer left out; one monotonic clock), and the
ranks' returns apart (the later rank's lag, which a profile reads as its wait's gap), in a stack
of ``fully_shard`` blocks, once with the stem trained (every block's post-backward from its
hook) and once frozen (the first block's from the final callback), 2 gloo ranks, no dagprof. Wall time: run it under the
lock, say the load.

    flock /tmp/dagprof-measure.lock torchrun --standalone --nproc-per-node 2 bench/fsdp_final_rs.py [--steps 20]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

WIDTH, BLOCKS, BATCH = 384, 4, 64


def model(frozen_stem: bool) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(WIDTH, WIDTH), *[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
                                                 for _ in range(BLOCKS)], nn.Linear(WIDTH, 10))
    m[0].requires_grad_(not frozen_stem)
    for block in m[1:1 + BLOCKS]:
        fully_shard(block)
    fully_shard(m)
    return m


def run(frozen_stem: bool, steps: int) -> list[list[tuple[int, int]]]:
    """Each step's reduce-scatter calls in issue order: (issue, return), monotonic ns."""
    m = model(frozen_stem)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.01)
    name = "reduce_scatter_single" if "reduce_scatter_single" in dist.__dict__ else "reduce_scatter_tensor"
    inner = getattr(dist, name)
    calls: list[tuple[int, int]] = []

    def timed(*args, **kwargs):
        t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        out = inner(*args, **kwargs)
        calls.append((t0, time.clock_gettime_ns(time.CLOCK_MONOTONIC)))
        return out

    setattr(dist, name, timed)
    x, y = torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,))
    out = []
    try:
        for step in range(steps + 2):
            calls.clear()
            loss = nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step >= 2:
                out.append(list(calls))
    finally:
        setattr(dist, name, inner)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    res = {}
    for _ in range(2):  # interleaved: the machine's load reaches both alike
        for frozen in (False, True):
            res.setdefault("frozen stem" if frozen else "trained stem", []).extend(run(frozen, args.steps))
    mine = {k: np.array(v) for k, v in res.items()}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, {k: v.tolist() for k, v in mine.items()})
    if dist.get_rank() == 0:
        summary = {}
        for k in mine:
            per = np.array([every[r][k] for r in range(len(every))], dtype=np.float64)  # ranks x steps x calls x (issue, return)
            span = (per[..., 1].mean(axis=0) - per[..., 0].max(axis=0)) / 1e3  # steps x calls, us
            # the ranks' returns apart: what a profile reads as the later rank's wait after the collective ended (its gap;
            # ``pair_units.py --kinds`` gives the mean of both ranks', half of this for 2)
            apart = (per[..., 1].max(axis=0) - per[..., 1].min(axis=0)) / 1e3
            summary[k] = {"calls a step": int(span.shape[1]), "median us by call": np.median(span, axis=0).round(0).tolist(),
                          "mean us by call": span.mean(axis=0).round(0).tolist(),
                          "returns apart, mean us by call": apart.mean(axis=0).round(0).tolist(),
                          "returns apart, median us by call": np.median(apart, axis=0).round(0).tolist()}
        print(json.dumps({"torch": torch.__version__, "load": os.getloadavg(), "later issue to return, by call": summary}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
