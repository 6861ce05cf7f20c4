"""A user's Horovod script: a keyword-spotting 1-D CNN over synthetic log-mel frames (Conv1d + BatchNorm + ReLU
blocks with a stride, global average pooling, a Linear over 12 keywords), label-smoothed cross entropy, AdamW.

Habits it exercises that the other Horovod scripts do not: mixed precision as Horovod's docs write it for AMP
(``torch.autocast`` with a ``torch.amp.GradScaler``: ``scaler.scale(loss).backward()``, ``optimizer.synchronize()``,
``scaler.unscale_(optimizer)``, clipping, then ``scaler.step(optimizer)`` under ``optimizer.skip_synchronize()`` and
``scaler.update()``: the scaler may skip a step whose gradients are not finite), ``torch.optim.AdamW`` with a
``CosineAnnealingLR`` stepped every step, ``model.zero_grad(set_to_none=True)`` (Horovod 0.28's
``optimizer.zero_grad()`` takes no ``set_to_none``), and SpecAugment-style masking of the batch in the loop.
Tried first: ``hvd.SyncBatchNorm``, which Horovod runs on GPUs only ("SyncBatchNorm expected input tensor to be on
GPU"). No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_kws_amp.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod keyword spotting with AMP")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--mels", type=int, default=40)
parser.add_argument("--frames", type=int, default=98)
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)


def block(cin, cout, stride):
    return nn.Sequential(nn.Conv1d(cin, cout, 5, stride=stride, padding=2, bias=False), nn.BatchNorm1d(cout), nn.ReLU())


model = nn.Sequential(block(args.mels, 64, 1), block(64, 96, 2), block(96, 128, 2), block(128, 128, 2),
                      nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(128, 12))
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3 * hvd.size(), weight_decay=0.01)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
scaler = torch.amp.GradScaler("cpu")

g = torch.Generator().manual_seed(hvd.rank())
model.train()
for step in range(args.steps):
    x = torch.randn(args.batch_size, args.mels, args.frames, generator=g)
    y = torch.randint(0, 12, (args.batch_size,), generator=g)
    f0 = int(torch.randint(0, args.mels - 8, (1,), generator=g))
    x[:, f0:f0 + 8] = 0.0  # frequency masking
    model.zero_grad(set_to_none=True)  # Horovod 0.28's optimizer.zero_grad() takes no set_to_none
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
    scaler.scale(loss).backward()
    optimizer.synchronize()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    with optimizer.skip_synchronize():
        scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    if step % 5 == 0 and hvd.rank() == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
