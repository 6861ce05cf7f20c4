"""A DDP job that saves with ``torch.distributed.checkpoint`` inside its traced steps, traced the way a user traces it
(plain ``torch.profiler``, ``record_shapes=True``, no stack, no dagprof hooks). DCP's planner gathers and scatters
pickled objects in DDP's one gloo group: once under a ``record_function("checkpoint")`` range the user named, once
bare, so a reader says the range where the trace has one and that it cannot tell where it has none (a user's CRF trace
had its DCP save's gathers called a loss's all-gather's backward). ``--before-forward``: each save at the start of the
next step, before its forward, as a loop that checkpoints "before training step N" writes it.

    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/dcp_kineto.py OUT_DIR [--before-forward]
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = tempfile.mkdtemp(prefix="dcp-kineto-") if rank == 0 else ""
root = [ckpt]
dist.broadcast_object_list(root)


def save(after: int) -> None:
    if after == 2:
        with record_function("checkpoint"):
            dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(root[0], "named"))
    if after == 3:
        dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(root[0], "bare"))


with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=1, warmup=1, active=3),
             on_trace_ready=tensorboard_trace_handler(sys.argv[1], worker_name=f"rank{rank}", use_gzip=True)) as prof:
    for step in range(5):
        after = step - ("--before-forward" in sys.argv)  # the step whose optimizer step the save follows
        x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
        if after < step:
            save(after)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if after == step:
            save(after)
        prof.step()
dist.destroy_process_group()
