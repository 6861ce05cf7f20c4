"""The embedded demo job: a ResNet-like CNN trained with real multi-process gloo DDP.

``run_demo_training`` spawns the ranks itself (one thread each, synthetic data, SGD) and
profiles a window of steps with ``dagprof.profile``. The same file is a plain training
script for the zero-code mode::

    dagprof profile -o RUN -- torchrun --nproc-per-node 2 -m dagprof.collect.demo_train --steps 12

Default model: 2.8 M parameters (11 MB of fp32 gradients), 60 leaf modules, so
``bucket_cap_mb=1`` gives about 11 DDP buckets; about 0.2-0.3 s per iteration at batch 16
on one core of this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any


@dataclass
class DemoConfig:
    world_size: int = 2
    steps: int = 30
    profile_steps: tuple[int, int] | None = (10, 20)  # None: train without any profiler
    profiler: str = "dagprof"  # or "torch": plain torch.profiler over the same steps (the baseline for overhead)
    bucket_cap_mb: float = 1.0
    batch_size: int = 16
    image_size: int = 24
    width: int = 32  # channels of the first stage; stages double it
    blocks: tuple[int, ...] = (2, 2, 2, 2)
    ddp: bool = True  # False: one process, no DistributedDataParallel (compute-only profile)
    kineto: bool = True
    record_shapes: bool = False
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # options passed on to dagprof.profile

    @classmethod
    def small(cls, **overrides: Any) -> "DemoConfig":
        """A tiny model for tests: a few ms per step, still several buckets."""
        base = dict(width=8, blocks=(1, 1, 1), image_size=12, batch_size=4, bucket_cap_mb=0.01, steps=6, profile_steps=(2, 4))
        return cls(**{**base, **overrides})


def build_model(cfg: DemoConfig):
    """ResNet-like: stem, stages of basic blocks (stride 2 between stages), pooling, linear head."""
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu1 = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu2 = nn.ReLU(inplace=True)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x if self.down is None else self.down(x)
            y = self.relu1(self.bn1(self.conv1(x)))
            return self.relu2(self.bn2(self.conv2(y)) + identity)

    class DemoNet(nn.Module):
        def __init__(self):
            super().__init__()
            w = cfg.width
            self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True))
            layers, cin = [], w
            for stage, n in enumerate(cfg.blocks):
                cout = w * 2**stage
                for j in range(n):
                    layers.append(Block(cin, cout, 2 if (j == 0 and stage > 0) else 1))
                    cin = cout
            self.layers = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(cin, 10)

        def forward(self, x):
            return self.fc(self.flatten(self.pool(self.layers(self.stem(x)))))

    return DemoNet()


def train(cfg: DemoConfig, out_dir: str | None, rank: int, cpu_times: list[float] | None = None) -> list[float]:
    """Train ``cfg.steps`` steps in this process (dist already initialised when cfg.ddp); seconds per step.

    ``cpu_times`` receives the main thread's CPU seconds per step: unlike wall time it does not
    grow when other processes compete for the cores, so it isolates profiling overhead.
    """
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    if cfg.ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, bucket_cap_mb=cfg.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(cfg.seed + 1 + rank)
    batches = [
        (torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, generator=gen),
         torch.randint(0, 10, (cfg.batch_size,), generator=gen))
        for _ in range(4)
    ]
    times: list[float] = []

    def one_step(i: int) -> None:
        x, y = batches[i % len(batches)]
        c0, t0 = time.thread_time(), time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)  # the step itself; window start/stop work is not in it
        if cpu_times is not None:
            cpu_times.append(time.thread_time() - c0)

    window = range(*cfg.profile_steps) if cfg.profile_steps is not None and out_dir is not None else None
    if window is None:
        for i in range(cfg.steps):
            one_step(i)
    elif cfg.profiler == "torch":
        from torch.profiler import ProfilerAction, profile as torch_profile

        def schedule(s: int) -> ProfilerAction:
            if s not in window:
                return ProfilerAction.NONE
            return ProfilerAction.RECORD_AND_SAVE if s == window.stop - 1 else ProfilerAction.RECORD

        with torch_profile(record_shapes=cfg.record_shapes, schedule=schedule) as tp:
            for i in range(cfg.steps):
                one_step(i)
                tp.step()
    else:
        from .profile import profile

        with profile(out_dir, steps=window, model=model, kineto=cfg.kineto, record_shapes=cfg.record_shapes, **cfg.extra) as prof:
            for i in range(cfg.steps):
                one_step(i)
                prof.step()
    return times


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, cfg: DemoConfig, out_dir: str | None, port: int, results: str) -> None:
    import torch.distributed as dist

    if cfg.ddp:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(cfg.world_size))
        dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size, timeout=timedelta(seconds=120))
    cpu: list[float] = []
    try:
        wall = train(cfg, out_dir, rank, cpu)
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

    world = cfg.world_size if cfg.ddp else 1
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="dagprof-demo-") as results:
        mp.spawn(_worker, args=(cfg, out_dir, _free_port(), results), nprocs=world, join=True)
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
    """Plain DDP script for torchrun (``-m dagprof.collect.demo_train``): no dagprof calls inside."""
    p = argparse.ArgumentParser(description="dagprof demo: ResNet-like CNN, synthetic data, gloo DDP")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--bucket-cap-mb", type=float, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--small", action="store_true", help="tiny model (tests)")
    args = p.parse_args(argv)
    import torch.distributed as dist

    base = DemoConfig.small() if args.small else DemoConfig()
    cfg = DemoConfig(**{**asdict(base), "steps": args.steps, "profile_steps": None,
                        "bucket_cap_mb": args.bucket_cap_mb or base.bucket_cap_mb, "batch_size": args.batch_size or base.batch_size})
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        times = train(cfg, None, dist.get_rank())
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"demo_train: {len(times)} steps, median {statistics.median(times) * 1e3:.1f} ms/step", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
