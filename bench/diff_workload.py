"""The demo job with one known change, profiled: the recorded pairs ``dagprof diff`` is judged on.

A ``Variant`` is the embedded demo model (``collect.jobs.demo_train``) trained with real gloo DDP
and profiled by ``dagprof.profile``, with at most a few known differences: a layer whose forward
sleeps ``slow_ms`` (on every rank, or on ``slow_rank`` only: a straggler), another bucket size,
another model width, or an unrelated model (``mlp``). ``record(variant, out_dir)`` writes a dagprof run folder.

The sleep is inside the module's own ``forward``, so the profiler's per-layer span (opened by
its hooks around the call) includes it: the change is exactly "this layer, this much slower".
"""
from __future__ import annotations

import gc
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta


@dataclass(frozen=True)
class Variant:
    bucket_cap_mb: float | None = None  # None: the model's default (0.01 MB small: several buckets; 1 MB full)
    slow_layer: str | None = None  # leaf module path, e.g. "layers.1.conv2"
    slow_ms: float = 0.0  # sleep per forward call of that layer
    slow_rank: int | None = None  # None: every rank
    small: bool = True  # the tiny test model (a few ms per step) or the full demo model
    world_size: int = 2
    steps: int = 8
    profile_steps: tuple[int, int] = (2, 6)
    model: dict = field(default_factory=dict)  # DemoConfig overrides (width, blocks, ...)
    mlp: bool = False  # another training altogether: a small MLP instead of the demo CNN
    strategy: str | None = None  # a strategy file (dagprof optimize), applied with dagprof.apply


def _config(v: Variant):
    from dagprof.collect.jobs.demo_train import DemoConfig

    base = DemoConfig.small() if v.small else DemoConfig()
    cap = base.bucket_cap_mb if v.bucket_cap_mb is None else v.bucket_cap_mb
    return DemoConfig(**{**asdict(base), "world_size": v.world_size, "steps": v.steps, "profile_steps": v.profile_steps,
                         "bucket_cap_mb": cap, "strategy": v.strategy, **v.model})


def _slow(forward, seconds: float):
    def wrapped(*args, **kwargs):
        time.sleep(seconds)
        return forward(*args, **kwargs)

    return wrapped


def _mlp(cfg):
    import torch.nn as nn

    return nn.Sequential(nn.Flatten(), nn.Linear(3 * cfg.image_size**2, 64), nn.ReLU(), nn.Linear(64, 10))


def _worker(rank: int, v: Variant, out_dir: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dagprof
    from dagprof.collect.jobs.demo_train import build_model

    cfg = _config(v)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=v.world_size, timeout=timedelta(seconds=120))
    try:
        torch.manual_seed(cfg.seed)
        model = _mlp(cfg) if v.mlp else build_model(cfg)
        if v.slow_layer and (v.slow_rank is None or v.slow_rank == rank):
            layer = model.get_submodule(v.slow_layer)
            layer.forward = _slow(layer.forward, v.slow_ms / 1e3)
        ddp = DDP(model, bucket_cap_mb=cfg.bucket_cap_mb)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        gen = torch.Generator().manual_seed(cfg.seed + 1 + rank)
        x = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, generator=gen)
        y = torch.randint(0, 10, (cfg.batch_size,), generator=gen)
        with dagprof.profile(out_dir, steps=range(*v.profile_steps), model=ddp) as prof:
            for _ in range(v.steps):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(ddp(x), y).backward()
                opt.step()
                prof.step()
        # Gloo aborts the process (std::terminate) when a rank tears down its pairs while the
        # reducer's work is still alive or a peer is still sending: drop DDP, then meet, then destroy.
        del ddp, opt
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def record(v: Variant, out_dir: str | os.PathLike[str]) -> str:
    """Train and profile ``v`` with ``v.world_size`` spawned gloo ranks; the run folder."""
    import torch.multiprocessing as mp

    out = os.path.abspath(os.fspath(out_dir))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(v, out, port), nprocs=v.world_size, join=True)
    return out
