"""A user's Horovod script: a PointNet classifier over synthetic point clouds (a shared per-point MLP written as
``Conv1d(kernel_size=1)`` layers with BatchNorm, a max-pool over the points, an MLP head with Dropout), fine-tuned:
the first point-MLP layer is frozen (``requires_grad=False``), as when a pretrained encoder's stem is kept.

Habits it exercises that the other Horovod scripts do not: only the trainable parameters handed to the optimizer and
to ``hvd.DistributedOptimizer(named_parameters=...)`` (the frozen ones never all-reduced), the run's settings sent from
rank 0 with ``hvd.broadcast_object``, a ``OneCycleLR`` schedule stepped every batch, ``model.zero_grad(set_to_none=True)`` (Horovod's optimizer's
``zero_grad`` takes no argument),
the predictions and labels of a batch gathered with ``hvd.allgather`` under ``torch.no_grad()`` every 4 steps for a
global accuracy on rank 0, and ``hvd.join()`` before exit. No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_pointnet_frozen.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod PointNet fine-tuning, frozen stem")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--points", type=int, default=256)
parser.add_argument("--lr", type=float, default=0.002)
args = parser.parse_args()

hvd.init()
torch.set_num_threads(1)
config = hvd.broadcast_object({"seed": 2024, "classes": 8, "max_lr": args.lr * hvd.size()}, root_rank=0)
torch.manual_seed(config["seed"])


class PointNet(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv1d(3, 64, 1), nn.BatchNorm1d(64), nn.ReLU())
        self.point_mlp = nn.Sequential(nn.Conv1d(64, 128, 1), nn.BatchNorm1d(128), nn.ReLU(),
                                       nn.Conv1d(128, 256, 1), nn.BatchNorm1d(256), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(256, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, classes))

    def forward(self, points):  # (batch, 3, points)
        return self.head(self.point_mlp(self.stem(points)).amax(dim=2))


model = PointNet(config["classes"])
for p in model.stem.parameters():  # the pretrained stem stays as it is
    p.requires_grad = False
trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

g = torch.Generator().manual_seed(7 + hvd.rank())
clouds = [(torch.randn(args.batch_size, 3, args.points, generator=g), torch.randint(0, config["classes"], (args.batch_size,), generator=g))
          for _ in range(5)]

optimizer = torch.optim.AdamW([p for _, p in trainable], lr=config["max_lr"], weight_decay=0.01)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=trainable)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config["max_lr"], total_steps=args.steps)

model.train()
for step in range(args.steps):
    points, labels = clouds[step % len(clouds)]
    model.zero_grad(set_to_none=True)  # Horovod's optimizer.zero_grad() takes no set_to_none
    logits = model(points)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    optimizer.step()
    schedule.step()
    if step % 4 == 3:
        with torch.no_grad():
            preds = hvd.allgather(logits.argmax(1), name="preds")
            truth = hvd.allgather(labels, name="labels")
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.item():.4f} global acc {(preds == truth).float().mean().item():.3f}", flush=True)
hvd.join()
