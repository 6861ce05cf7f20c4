"""Real 2-rank gloo DDP runs traced by stock torch.profiler: the CPU reference traces for tests.

Run as a script it trains a tiny CNN and writes one Kineto trace per rank. A *scenario*
sets each rank's profiler window, as real jobs do (``SCENARIOS``):

- ``same``: both ranks profile iterations 2-4 (schedule wait=1, warmup=1, active=3);
- ``schedules``: each rank has its own schedule: rank 0 iterations 2-4, rank 1 iterations 3-5;
- ``late-start``: rank 1 creates its profiler one iteration later than rank 0, so the same
  iteration is ``ProfilerStep#2`` on rank 0 and ``ProfilerStep#1`` on rank 1.

``gloo_traces(scenario)`` records once per torch version and script content and reuses the
folder afterwards (tests on 2 cores must stay short). To re-record the fixtures in
tests/data/gloo-windows::

    python tests/gloo_kineto.py --fixtures tests/data/gloo-windows
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile

# per rank: (iteration at which the profiler is created, wait, warmup, active); iterations run
SCENARIOS: dict[str, tuple[list[tuple[int, int, int, int]], int]] = {
    "same": ([(0, 1, 1, 3), (0, 1, 1, 3)], 5),
    "schedules": ([(0, 1, 1, 3), (0, 2, 1, 3)], 7),
    "late-start": ([(0, 0, 1, 3), (1, 0, 1, 3)], 6),
}


def _train(rank: int, world: int, out: str, port: int, scenario: str) -> None:
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
    windows, iterations = SCENARIOS[scenario]
    begin, wait, warmup, active = windows[rank]
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
        schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(out, worker_name=f"rank-{rank}"))
    for it in range(iterations):
        if it == begin:
            prof.start()
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if it >= begin:
            prof.step()
    prof.stop()
    dist.barrier()  # no rank tears gloo down while the other still uses it
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(folder: str, scenario: str) -> None:
    """One real run of ``scenario`` into ``folder`` (rank-0...json, rank-1...json). A second try on a fresh port
    when the first fails (on a shared machine another job may take the free port first); then its output."""
    for _attempt in range(2):
        for f in glob.glob(os.path.join(folder, "*.json")):
            os.remove(f)
        done = subprocess.run([sys.executable, __file__, folder, str(_free_port()), scenario], timeout=300,
                              capture_output=True, text=True)
        if done.returncode == 0:
            return
    raise RuntimeError(f"recording {scenario} failed twice; last output:\n{(done.stdout + done.stderr)[-3000:]}")


def gloo_traces(scenario: str = "same") -> str:
    """Folder with rank-0...json and rank-1...json of ``scenario`` (recorded on first use, then reused)."""
    import torch

    with open(__file__, "rb") as f:
        digest = hashlib.sha1(f.read() + torch.__version__.encode() + scenario.encode()).hexdigest()[:10]
    folder = os.path.join(tempfile.gettempdir(), f"dagprof-gloo-traces-{digest}")
    if os.path.isdir(folder):
        return folder
    tmp = tempfile.mkdtemp(prefix="dagprof-gloo-")
    record(tmp, scenario)
    try:
        os.rename(tmp, folder)  # atomic: a concurrent test run either wins or reuses ours
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def gzip_traces(tmp: str, folder: str) -> None:
    """Each rank's trace ``tmp``/rank-N.*.json, gzipped into ``folder`` as rank-N.pt.trace.json.gz (the fixtures' form)."""
    for path in sorted(glob.glob(os.path.join(tmp, "*.json"))):
        rank = os.path.basename(path).split(".")[0]
        with open(path, "rb") as src, gzip.open(os.path.join(folder, f"{rank}.pt.trace.json.gz"), "wb", 9) as dst:
            dst.write(src.read())


def write_fixtures(out: str) -> None:
    """Every scenario, gzipped, into ``out``/<scenario>/ (replacing what was there)."""
    for scenario in SCENARIOS:
        folder = os.path.join(out, scenario)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        with tempfile.TemporaryDirectory() as tmp:
            record(tmp, scenario)
            gzip_traces(tmp, folder)


if __name__ == "__main__":
    if sys.argv[1] == "--fixtures":
        write_fixtures(sys.argv[2])
    else:
        import torch.multiprocessing as mp

        mp.spawn(_train, args=(2, sys.argv[1], int(sys.argv[2]), sys.argv[3]), nprocs=2)
