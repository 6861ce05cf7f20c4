"""The embedded demo job: a small model (``workloads``) trained with real multi-process gloo DDP.

``run_demo_training`` spawns the ranks itself (one thread each, synthetic data, SGD) and
profiles a window of steps with ``dagprof.profile``. The same file is a plain training
script for the zero-code mode and for launchers (``netns.run_ranks``)::

    dagprof profile -o RUN -- torchrun --nproc-per-node 2 -m dagprof.collect.jobs.demo_train --steps 12
    python -m dagprof.collect.jobs.demo_train --model mlp --profile RUN --profile-steps 4:10 --times T.json
    python -m dagprof.collect.jobs.demo_train --strategy strategy.json --times T.json   # dagprof.apply'd

Default model: 2.8 M parameters (11 MB of fp32 gradients), 60 leaf modules, so
``bucket_cap_mb=1`` gives about 11 DDP buckets; about 0.2-0.3 s per iteration at batch 16
on one core of this machine.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any


@dataclass
class DemoConfig:
    model: str = "cnn"  # a workloads.WORKLOADS name
    world_size: int = 2
    steps: int = 30
    profile_steps: tuple[int, int] | None = (10, 20)  # None: train without any profiler
    profiler: str = "dagprof"  # or "torch": plain torch.profiler over the same steps (the baseline for overhead)
    bucket_cap_mb: float | None = 1.0  # None: DDP's defaults (1 MiB first bucket, then 25 MiB)
    batch_size: int = 16
    image_size: int = 24
    width: int = 32  # channels of the first stage; stages double it
    blocks: tuple[int, ...] = (2, 2, 2, 2)
    ddp: bool = True  # False: one process, no DistributedDataParallel (compute-only profile)
    kineto: bool = True
    record_shapes: bool = False
    seed: int = 0
    strategy: str | None = None  # a strategy file, applied with dagprof.apply before training
    extra: dict[str, Any] = field(default_factory=dict)  # options passed on to dagprof.profile

    @classmethod
    def small(cls, **overrides: Any) -> "DemoConfig":
        """A tiny model for tests: a few ms per step, still several buckets."""
        base = dict(width=8, blocks=(1, 1, 1), image_size=12, batch_size=4, bucket_cap_mb=0.01, steps=6, profile_steps=(2, 4))
        return cls(**{**base, **overrides})

    @classmethod
    def workload(cls, model: str, **overrides: Any) -> "DemoConfig":
        """Settings of a named workload, sized so that on a 200 Mbit/s link backward takes about half
        as long as the gradient all-reduce (so both bucketing and compression matter)."""
        presets = {"cnn": {}, "mlp": dict(width=512, blocks=(8,), batch_size=768),
                   "transformer": dict(width=192, blocks=(1, 1, 1), image_size=32, batch_size=24)}
        if model not in presets:
            raise ValueError(f"unknown workload {model!r}; choose one of {', '.join(presets)}")
        return cls(**{"model": model, **presets[model], **overrides})


def build_model(cfg: DemoConfig):
    """The model of ``cfg`` (``workloads.build``)."""
    from .workloads import build

    return build(cfg)


def train(cfg: DemoConfig, out_dir: str | None, rank: int, cpu_times: list[float] | None = None) -> list[float]:
    """Train ``cfg.steps`` steps in this process (dist already initialised when cfg.ddp); seconds per step.

    ``cpu_times`` receives the main thread's CPU seconds per step: unlike wall time it does not
    grow when other processes compete for the cores, so it isolates profiling overhead. With a
    strategy that accumulates gradients a step holds ``micro_batches(cfg)`` forward/backward passes.
    """
    import torch

    from .workloads import batches as make_batches

    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    if cfg.ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, bucket_cap_mb=cfg.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = make_batches(cfg, rank)
    times: list[float] = []
    plan: list = []

    def one_step(i: int) -> None:
        c0, t0 = time.thread_time(), time.perf_counter()
        opt.zero_grad(set_to_none=True)
        micro = plan[0].micro_batches if plan else 1
        for j in range(micro):
            x, y, loss = batches[(i * micro + j) % len(batches)]
            with plan[0].sync(j) if plan else contextlib.nullcontext():
                loss(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)  # the step itself; window start/stop work is not in it
        if cpu_times is not None:
            cpu_times.append(time.thread_time() - c0)

    def apply_strategy() -> None:  # after a profile attached, so its timing hook wraps the strategy's
        if cfg.strategy:
            from ..deploy.apply import apply

            plan.append(apply(model, cfg.strategy))

    window = range(*cfg.profile_steps) if cfg.profile_steps is not None and out_dir is not None else None
    if window is None:
        apply_strategy()
        for i in range(cfg.steps):
            one_step(i)
    elif cfg.profiler == "torch":
        from torch.profiler import ProfilerAction, profile as torch_profile

        def schedule(s: int) -> ProfilerAction:
            if s not in window:
                return ProfilerAction.NONE
            return ProfilerAction.RECORD_AND_SAVE if s == window.stop - 1 else ProfilerAction.RECORD

        apply_strategy()
        with torch_profile(record_shapes=cfg.record_shapes, schedule=schedule) as tp:
            for i in range(cfg.steps):
                one_step(i)
                tp.step()
    else:
        from ..hooks.profile import profile

        with profile(out_dir, steps=window, model=model, kineto=cfg.kineto, record_shapes=cfg.record_shapes, **cfg.extra) as prof:
            apply_strategy()
            for i in range(cfg.steps):
                one_step(i)
                prof.step()
    return times


def alternate(cfg: DemoConfig, rank: int, rounds: int, warmup: int, steps: int, work: str) -> None:
    """``rounds`` rounds of DDP defaults (A) and ``cfg.strategy`` (B) in this one process, A B then B A.

    Each phase wraps the same model (and optimizer) in a fresh DistributedDataParallel, applies the
    strategy for B, trains ``warmup + steps`` steps under a hooks-only profile of the last ``steps``
    and writes ``work/round<k>-<A|B>/run`` (the profile) and ``.../times`` (step times). Phases seconds
    apart see the same machine load, which separate jobs a minute apart do not.
    """

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..deploy.apply import apply
    from ..hooks.profile import profile
    from ..hooks.steptimes import write_times
    from .workloads import batches as make_batches

    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = make_batches(cfg, rank)
    for k in range(rounds):
        for which in ("A", "B") if k % 2 == 0 else ("B", "A"):
            folder = os.path.join(work, f"round{k}-{which}")
            ddp = DDP(model, bucket_cap_mb=cfg.bucket_cap_mb)
            times: list[float] = []
            with profile(os.path.join(folder, "run"), steps=range(warmup, warmup + steps), model=ddp, kineto=False) as prof:
                plan = apply(ddp, cfg.strategy) if which == "B" else None
                micro = plan.micro_batches if plan else 1
                for i in range(warmup + steps):
                    t0 = time.perf_counter()
                    opt.zero_grad(set_to_none=True)
                    for j in range(micro):
                        x, y, loss = batches[(i * micro + j) % len(batches)]
                        with plan.sync(j) if plan else contextlib.nullcontext():
                            loss(ddp(x), y).backward()
                    opt.step()
                    times.append(time.perf_counter() - t0)
                    prof.step()
            if plan:
                plan.remove()
            write_times(os.path.join(folder, "times"), rank, times[warmup:], micro)
            del ddp, prof, plan
            gc.collect()  # the old reducer's gradient hooks must be gone before the next wrapper's
            dist.barrier()


def micro_batches(cfg: DemoConfig) -> int:
    if not cfg.strategy:
        return 1
    from ..deploy.strategy import load_strategy

    return load_strategy(cfg.strategy).accumulate


def _worker(rank: int, cfg: DemoConfig, out_dir: str | None, port: int, results: str) -> None:
    import torch.distributed as dist

    if cfg.ddp:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(cfg.world_size))
        dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size, timeout=timedelta(seconds=120))
    cpu: list[float] = []
    try:
        wall = train(cfg, out_dir, rank, cpu)
        if cfg.ddp:
            gc.collect()  # the DDP wrapper (and the gloo work it holds) goes now, while Python is fully alive
            dist.barrier()  # no rank tears gloo down while another still writes its profile
    finally:
        if cfg.ddp:
            dist.destroy_process_group()
    with open(os.path.join(results, f"times{rank}.json"), "w") as f:
        json.dump({"wall": wall, "cpu": cpu}, f)


def spawn_demo(cfg: DemoConfig, out_dir: str | None = None) -> list[list[float]]:
    """Run the job (``cfg.world_size`` spawned ranks); per-rank seconds per step."""
    return spawn_demo_clocks(cfg, out_dir)["wall"]


def spawn_demo_clocks(cfg: DemoConfig, out_dir: str | None = None) -> dict[str, list[list[float]]]:
    """Like ``spawn_demo``, with both clocks: "wall" (step time) and "cpu" (main thread CPU time per step)."""
    import torch.multiprocessing as mp

    from .netns import free_port

    world = cfg.world_size if cfg.ddp else 1
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="dagprof-demo-") as results:
        mp.spawn(_worker, args=(cfg, out_dir, free_port(), results), nprocs=world, join=True)
        per_rank = []
        for r in range(world):
            with open(os.path.join(results, f"times{r}.json")) as f:
                per_rank.append(json.load(f))
    return {clock: [t[clock] for t in per_rank] for clock in ("wall", "cpu")}


def run_demo_training(out_dir: str | os.PathLike[str], world_size: int = 2, steps: int = 30,
                      profile_steps: tuple[int, int] | range = (10, 20), bucket_cap_mb: float = 1.0,
                      **options: Any) -> str:
    """Profile the demo job into ``out_dir`` and return it (the dagprof run folder).

    ``options``: any other ``DemoConfig`` field (batch_size, width, kineto, ddp, ...).
    """
    window = (profile_steps.start, profile_steps.stop) if isinstance(profile_steps, range) else tuple(profile_steps)
    cfg = DemoConfig(world_size=world_size, steps=steps, profile_steps=window, bucket_cap_mb=bucket_cap_mb, **options)
    out = os.path.abspath(os.fspath(out_dir))
    spawn_demo(cfg, out)
    return out


def main(argv: list[str] | None = None) -> int:
    """DDP training script for torchrun or ``netns.run_ranks`` (env:// rendezvous); no dagprof calls
    inside unless asked: ``--profile`` (a window), ``--strategy`` (dagprof.apply), ``--times`` (step times)."""
    p = argparse.ArgumentParser(description="dagprof demo: a small model, synthetic data, gloo DDP")
    p.add_argument("--model", default="cnn", help="workload: cnn (default), mlp or transformer")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP bucket_cap_mb (default: DDP's own; --small: 0.01)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--depth", type=int, default=None, help="mlp: Linear layers (default 8)")
    p.add_argument("--small", action="store_true", help="tiny model (tests)")
    p.add_argument("--profile", default=None, metavar="DIR", help="profile a window of steps into this run folder")
    p.add_argument("--profile-steps", default=None, metavar="A:B", help="the profiled window (default: the middle third)")
    p.add_argument("--no-kineto", action="store_true", help="profile with dagprof's hooks only")
    p.add_argument("--strategy", default=None, help="a dagprof strategy file to apply before training")
    p.add_argument("--times", default=None, metavar="DIR", help="write this rank's step times to DIR/rank<r>.json")
    p.add_argument("--alternate", type=int, default=0, metavar="ROUNDS",
                   help="with --strategy: ROUNDS rounds of defaults and strategy phases in this process (into --times DIR)")
    p.add_argument("--warmup", type=int, default=3, help="--alternate: steps per phase before the timed ones (default 3)")
    args = p.parse_args(argv)
    import torch.distributed as dist

    from ...traces.steps import parse_steps
    from ..hooks.steptimes import write_times

    base = DemoConfig.small(model=args.model) if args.small else DemoConfig.workload(args.model)
    if args.depth:
        base = DemoConfig(**{**asdict(base), "blocks": (args.depth,)})
    window = None
    if args.profile:
        r = parse_steps(args.profile_steps) if args.profile_steps else range(args.steps // 3, args.steps - args.steps // 6)
        window = (r.start, r.stop)
    cfg = DemoConfig(**{**asdict(base), "steps": args.steps, "profile_steps": window, "kineto": not args.no_kineto,
                        "bucket_cap_mb": args.bucket_cap_mb or (base.bucket_cap_mb if args.small else None), "batch_size": args.batch_size or base.batch_size,
                        "strategy": args.strategy, "world_size": int(os.environ.get("WORLD_SIZE", 1))})
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    try:
        rank = dist.get_rank()
        if args.alternate:
            if not (args.strategy and args.times):
                raise SystemExit("demo_train: --alternate needs --strategy and --times")
            alternate(cfg, rank, args.alternate, args.warmup, args.steps, args.times)
            dist.barrier()
            return 0
        if args.profile and dist.get_world_size() > 1:
            from ..measure.overlap import measure_into

            measure_into(args.profile, rank)  # every rank takes part
        times = train(cfg, args.profile, rank)
        dist.barrier()  # no rank tears the group down while a peer's last collective is in flight
    finally:
        dist.destroy_process_group()
    if args.times:
        write_times(args.times, rank, times, micro_batches(cfg))
    if rank == 0:
        print(f"demo_train: {len(times)} steps, median {statistics.median(times) * 1e3:.1f} ms/step", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
