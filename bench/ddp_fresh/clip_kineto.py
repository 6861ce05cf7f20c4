"""The CLIP script (``clip_contrastive.py``) traced the way a user traces it: plain ``torch.profiler`` with
``record_shapes=True`` and ``tensorboard_trace_handler``, no dagprof hooks. Its forward all-gathers and their backward
scatters sit in DDP's one gloo group beside the gradient all-reduces: a reader must not take them for gradients.

    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/clip_kineto.py OUT_DIR
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clip_contrastive import Clip  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(Clip(4000, 768, 256, 256))
opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=2, warmup=1, active=3),
             on_trace_ready=tensorboard_trace_handler(sys.argv[1], worker_name=f"rank{rank}", use_gzip=True)) as prof:
    for _ in range(7):
        tokens, images = torch.randint(1, 4000, (128, 32)), torch.randn(128, 768)
        loss = model(tokens, images)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
dist.destroy_process_group()
