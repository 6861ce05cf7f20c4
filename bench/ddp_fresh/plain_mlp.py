"""A user's DDP MLP on gloo, profiled the way the PyTorch profiler recipe shows: ``torch.profiler.profile`` with
``record_shapes=True``, a ``schedule`` and ``tensorboard_trace_handler`` writing one trace per rank, no dagprof code.
Without ``--trace-dir`` it trains unprofiled and prints its median step from step 5 on (what ``zero1_measure.py
--plain-profiler --trace-dir`` compares a prediction with).

    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/plain_mlp.py [--trace-dir DIR] [--steps 20]
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trace-dir", help="profile steps 3-5 into this folder")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                        nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    prof = None
    if args.trace_dir:
        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                       schedule=schedule(wait=2, warmup=1, active=3, repeat=1),
                       on_trace_ready=tensorboard_trace_handler(args.trace_dir, worker_name=f"rank{rank}", use_gzip=True))
        prof.start()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
    if rank == 0:
        tail = sorted(times[5:])
        print(f"plain_mlp: {args.steps} steps, median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
