"""One rank of the testbed job: an MLP trained with gloo DDP, run inside a rank's namespace.

The model is chosen so that communication matters on slow links (8 Linear layers, 22 MB of
fp32 gradients) while compute stays tens of ms per step on one thread.

Phases run in one process to pay torch's start-up once and to keep the profile, the link
sweep and the measured cells close in time (the machine's load drifts): before each phase
rank 0 writes ``ready<k>`` in the control folder, the driver sets the link rate and writes
``go<k>``. ``train:CAP`` trains ``warmup + steps`` steps with a fresh DDP wrapper of that
bucket cap; ``profile:CAP`` does the same under ``dagprof.profile`` (hooks only, no Kineto)
into ``<control>/run``, its window ``profile_margin`` unprofiled steps after the warm-up and
``steps`` before the end (both sides measure the profiler's cost and the job's drift); ``sweep`` times all-reduces over sizes (``dagprof calibrate``'s sweep);
``overlap:MB`` measures compute and an all-reduce of MB slowing each other (``calibrate --overlap``'s matrix loop), ``overlapbwd:MB``
the same beside this job's own backward.
Rank 0 writes each phase's result (step seconds, or sweep points) to ``results.json``.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time
from datetime import timedelta

WIDTHS = (512, 1024, 768, 1280, 640, 1024, 896, 512, 768)  # 8 Linear layers of 1.6..3.9 MB: buckets of unequal size


def build_model(width: int, depth: int, bias: bool = True):
    """``depth`` Linear+ReLU layers; widths cycle through WIDTHS scaled by ``width`` / 768, so
    per-layer buckets differ in size and a profile alone separates latency from bandwidth.
    Without ``bias`` each layer is one parameter, so DDP with a tiny bucket cap all-reduces
    layer by layer (the S-SGD model's WFBP, ``bench_sgd.py --testbed``)."""
    import torch.nn as nn

    dims = [max(8, int(WIDTHS[i % len(WIDTHS)] * width / 768)) for i in range(depth + 1)]
    layers = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b, bias=bias), nn.ReLU()]
    return nn.Sequential(*layers)


def wait_for(path: str, timeout_s: float = 300.0) -> None:
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"driver never wrote {path}")
        time.sleep(0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--control", required=True)
    p.add_argument("--phases", nargs="+", required=True, help="train:CAP_MB, profile:CAP_MB (into <control>/run), sweep, overlap:MB or overlapbwd:MB")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--profile-steps", type=int, default=10)
    p.add_argument("--profile-margin", type=int, default=0, help="unprofiled steps between the warm-up and the profiled window")
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--no-bias", action="store_true", help="Linear layers without bias: one parameter per layer")
    a = p.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{a.port}", rank=a.rank, world_size=a.world,
                            timeout=timedelta(seconds=300))
    torch.manual_seed(0)
    model = build_model(a.width, a.depth, bias=not a.no_bias)
    gen = torch.Generator().manual_seed(1 + a.rank)
    x = torch.randn(a.batch, model[0].in_features, generator=gen)
    y = torch.randn(a.batch, model[-2].out_features, generator=gen)
    results: list = []
    for k, phase in enumerate(a.phases):
        mode, _, cap = phase.partition(":")
        dist.barrier()
        if a.rank == 0:
            open(os.path.join(a.control, f"ready{k}"), "w").close()
        wait_for(os.path.join(a.control, f"go{k}"))
        dist.barrier()
        if mode == "sweep":
            from dagprof.collect.measure.calibrate import sweep

            results.append(sweep(iters=5))
            continue
        if mode in ("overlap", "overlapbwd"):  # compute and an all-reduce (of CAP MB, else calibrate's size) slowing each other:
            # calibrate --overlap's beside its matrix loop, or (overlapbwd) beside this job's own backward
            import msgspec

            from dagprof.collect.measure.overlap import OVERLAP_BYTES, backward_work, measure_overlap

            work = backward_work(lambda: torch.nn.functional.mse_loss(model(x), y)) if mode == "overlapbwd" else None
            # 16 repeats: beside a small all-reduce a repeat is ms long, and 4 of them scattered 1.4-8x on the loaded machine
            results.append(msgspec.to_builtins(measure_overlap(int(float(cap) * 2**20) if cap else OVERLAP_BYTES, repeats=16, work=work)))
            model.zero_grad(set_to_none=True)
            work = None  # its retained backward graph, freed before the next phase
            continue
        ddp = DDP(model, bucket_cap_mb=float(cap))
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()

        times = []
        if mode == "profile":
            from dagprof.collect.hooks.profile import profile

            first = a.warmup + a.profile_margin  # unprofiled steps on both sides: the profiler's cost and the drift (passes.profiler_cost)
            n = first + a.profile_steps
            with profile(os.path.join(a.control, "run"), steps=range(first, n), model=ddp, kineto=False) as prof:
                for _ in range(n + a.steps):
                    t0 = time.perf_counter()
                    step()
                    prof.step()
                    times.append(time.perf_counter() - t0)
        else:
            for _ in range(a.warmup + a.steps):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
        results.append(times[a.warmup:])
        ddp = opt = None  # freed before the next phase builds its own
    dist.barrier()
    if a.rank == 0:
        with open(os.path.join(a.control, "results.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()
    # what still holds the group (a retained backward graph, DDP's cycles) freed now, before interpreter finalization,
    # so gloo's threads are joined while they can still take the GIL (dagprof.collect.hooks.exit_gc; a CI run aborted
    # here once, "terminate called without an active exception", after the overlapbwd phase)
    gc.collect()


if __name__ == "__main__":
    main()
