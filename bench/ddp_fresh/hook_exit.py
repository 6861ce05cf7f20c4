"""A fresh DDP user script for reviewing dagprof: a script that ends with ``destroy_process_group()`` and leaves its
model to interpreter exit, under torch's comm hooks or none.

Habits it exercises, as users write them:
- the training written at module level, no ``main()``: the DDP model, its optimizer and the hook's state are globals,
  freed only at interpreter exit, after ``dist.destroy_process_group()`` (DDP's reducer is then its gloo group's last
  holder, and its destructor joins gloo's threads: pytorch/pytorch#56297 where one of them still needs the GIL);
- ``--hook fp16`` (``fp16_compress_hook``), ``--hook powersgd`` (``powerSGD_hook``, rank 1, from step 2) or none;
- a small MLP on random features, Adam; ``--dagprof DIR`` wraps the loop in ``dagprof.profile`` (the in-loop API).

    dagprof profile -o runs/exit -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/hook_exit.py --hook fp16
    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/hook_exit.py --hook powersgd --dagprof runs/exit-api
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--hook", choices=("none", "fp16", "powersgd"), default="none")
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--dagprof", metavar="DIR", help="profile steps 3..6 with dagprof.profile into DIR")
args = ap.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
if args.hook == "fp16":
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
elif args.hook == "powersgd":
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
    model.register_comm_hook(state, psgd.powerSGD_hook)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(dist.get_rank())

if args.dagprof:
    import dagprof

    profiling = dagprof.profile(args.dagprof, steps=(3, 7), model=model, kineto=False)
else:
    profiling = contextlib.nullcontext()
with profiling as prof:
    for _ in range(args.steps):
        x, y = torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if prof is not None:
            prof.step()
if dist.get_rank() == 0:
    print(f"hook_exit ({args.hook}): {args.steps} steps, loss {loss.item():.3f}", flush=True)
dist.destroy_process_group()
