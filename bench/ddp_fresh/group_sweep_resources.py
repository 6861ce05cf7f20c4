"""A fresh DDP user script for reviewing dagprof: two trials in one process, each with a process group of its own
(``destroy_process_group()`` at its end, the model dropped after), printing the process's native threads and sockets
after each step of the way: what a held group costs a sweep (``collect.hooks.exit_gc``).

    python bench/ddp_fresh/group_sweep_resources.py [--dagprof] [--port 29517]
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def threads_and_sockets() -> tuple[int, int]:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return len(os.listdir("/proc/self/task")), sum(x.startswith("socket:") for x in links)


def trial(tag: str, folder: str, profiled: bool) -> None:
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if profiled:
        import dagprof

        profiling = dagprof.profile(f"{folder}/{tag}", steps=(1, 3), model=model, kineto=False)
    else:
        profiling = contextlib.nullcontext()
    with profiling as prof:
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            if prof is not None:
                prof.step()
    dist.destroy_process_group()
    print(f"{tag}: after destroy_process_group, model alive: (threads, sockets) {threads_and_sockets()}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dagprof", action="store_true")
    ap.add_argument("--port", default="29517")
    args = ap.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=args.port, RANK="0", WORLD_SIZE="1")
    print(f"start: (threads, sockets) {threads_and_sockets()}")
    with tempfile.TemporaryDirectory() as folder:
        for tag in ("first", "second"):
            trial(tag, folder, args.dagprof)
            gc.collect()
            print(f"{tag}: model gone and collected: (threads, sockets) {threads_and_sockets()}", flush=True)


if __name__ == "__main__":
    main()
