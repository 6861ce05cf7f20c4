"""A real 2-rank gloo DDP run traced by stock torch.profiler: the CPU reference traces for tests.

Run as a script it trains a tiny CNN for 5 iterations (profiling 3) and writes one Kineto
trace per rank. ``gloo_traces()`` runs it once per torch version and script content and
reuses the folder afterwards (tests on 2 cores must stay short).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile

STEPS = 5
ACTIVE = 3


def _train(rank: int, world: int, out: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3), nn.ReLU(),
                          nn.Flatten(), nn.Linear(16 * 12 * 12, 10))
    ddp = DDP(model, bucket_cap_mb=0.05)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    sched = torch.profiler.schedule(wait=1, warmup=STEPS - 1 - ACTIVE, active=ACTIVE)
    handler = torch.profiler.tensorboard_trace_handler(out, worker_name=f"rank-{rank}")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                record_shapes=True, on_trace_ready=handler) as prof:
        for _ in range(STEPS):
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            prof.step()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_traces() -> str:
    """Folder with rank-0...json and rank-1...json (generated on first use, then reused)."""
    import torch

    with open(__file__, "rb") as f:
        digest = hashlib.sha1(f.read() + torch.__version__.encode()).hexdigest()[:10]
    folder = os.path.join(tempfile.gettempdir(), f"dagprof-gloo-traces-{digest}")
    if os.path.isdir(folder):
        return folder
    tmp = tempfile.mkdtemp(prefix="dagprof-gloo-")
    subprocess.run([sys.executable, __file__, tmp, str(_free_port())], check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        os.rename(tmp, folder)  # atomic: a concurrent test run either wins or reuses ours
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(_train, args=(2, sys.argv[1], int(sys.argv[2])), nprocs=2)
