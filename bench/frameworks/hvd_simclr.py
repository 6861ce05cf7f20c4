"""A user's Horovod script: SimCLR-style contrastive pretraining (a small conv encoder with BatchNorm, a 2-layer
projection head) on synthetic images, two augmented views of each, the NT-Xent loss, SGD with momentum.

Habits it exercises that the other Horovod scripts do not: both views through the encoder in one forward (the batch
concatenated), a loss over the views' similarity matrix (cross entropy against each sample's other view, the diagonal
masked out, local negatives only: no collective of the script's own), two parameter groups (no weight decay on
BatchNorm weights and biases) under one ``DistributedOptimizer``, and a linear warm-up into a cosine schedule by
``LambdaLR``. The augmentations are done by hand on tensors (random crop by padding and shifting, flips, brightness).
No dagprof line: ``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_simclr.py``.
"""
import argparse
import math

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod SimCLR")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--size", type=int, default=24)
parser.add_argument("--temperature", type=float, default=0.2)
parser.add_argument("--warmup", type=int, default=5)
args = parser.parse_args()

hvd.init()
torch.manual_seed(7)
torch.set_num_threads(1)


def block(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class SimCLR(nn.Module):
    def __init__(self, width=32, proj=128):
        super().__init__()
        self.encoder = nn.Sequential(block(3, width, 1), block(width, 2 * width, 2), block(2 * width, 4 * width, 2),
                                     block(4 * width, 8 * width, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(8 * width, 1024), nn.BatchNorm1d(1024), nn.ReLU(inplace=True), nn.Linear(1024, proj))

    def forward(self, x):
        return self.head(self.encoder(x))


def augment(x, g):
    """A random crop (pad 3, shift), a horizontal flip and a brightness jitter per image."""
    n, _, h, w = x.shape
    padded = F.pad(x, (3, 3, 3, 3), mode="reflect")
    dy, dx = torch.randint(0, 7, (2,), generator=g).tolist()
    out = padded[:, :, dy:dy + h, dx:dx + w]
    flip = torch.rand(n, generator=g) < 0.5
    out = torch.where(flip[:, None, None, None], out.flip(3), out)
    return out * (0.8 + 0.4 * torch.rand(n, 1, 1, 1, generator=g))


def nt_xent(z, temperature):
    """Each row's positive is its other view (rows i and i + n); every other row of the batch is a negative."""
    z = F.normalize(z, dim=1)
    n = z.shape[0] // 2
    sim = z @ z.t() / temperature
    sim.fill_diagonal_(float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, target)


model = SimCLR()
decay = [p for name, p in model.named_parameters() if p.ndim > 1]
no_decay = [p for name, p in model.named_parameters() if p.ndim <= 1]
base_lr = 0.05 * hvd.size()
optimizer = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=base_lr, momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def lr_at(step):
    if step < args.warmup:
        return (step + 1) / args.warmup
    return 0.5 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, args.steps - args.warmup)))


scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

g = torch.Generator().manual_seed(50 + hvd.rank())
images = torch.rand(4 * args.batch_size, 3, args.size, args.size, generator=g)
model.train()
for step in range(args.steps):
    i = (step * args.batch_size) % (len(images) - args.batch_size + 1)
    x = images[i:i + args.batch_size]
    optimizer.zero_grad()
    loss = nt_xent(model(torch.cat([augment(x, g), augment(x, g)])), args.temperature)
    loss.backward()
    optimizer.step()
    scheduler.step()
    if step % 5 == 0 and hvd.rank() == 0:
        print(f"step {step} loss {loss.item():.3f} lr {scheduler.get_last_lr()[0]:.4f}", flush=True)
