"""A user's Horovod script: a small ConvNeXt (Liu et al. 2022: a 4x4 patchify stem, stages of blocks each a depthwise
7x7 convolution, a channels-last LayerNorm, an inverted-bottleneck MLP of ``nn.Linear`` with GELU, a learned layer
scale and stochastic depth; LayerNorm + strided 2x2 convolutions between the stages, a pooled LayerNorm + Linear head)
classifying synthetic 32x32 images of oriented coloured gratings, with mixup.

Habits it exercises that the other Horovod scripts do not: the timm-style model pieces (a ``LayerNorm2d`` permuting to
channels-last and back, per-channel ``gamma`` layer-scale parameters, ``drop_path`` scaling each example's residual by a
random keep mask), mixup of each micro-batch with a shuffled copy and a soft-target cross entropy, gradient accumulation
by ``backward_passes_per_step=2`` (two micro-batches, one ``opt.step()``), AdamW with two parameter groups (no weight
decay on norms, biases and layer scales) and ``broadcast_optimizer_state`` after them, a warm-up then cosine schedule by
``SequentialLR(LinearLR, CosineAnnealingLR)``, and an EMA of the weights by ``torch.optim.swa_utils.AveragedModel`` with
``get_ema_multi_avg_fn``, updated after every step and evaluated at the end (its accuracy averaged over the ranks by
``hvd.allreduce``). No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_convnext_ema.py``.
"""
import argparse
import math

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

parser = argparse.ArgumentParser(description="Horovod ConvNeXt, synthetic gratings")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch", type=int, default=32, help="per rank and step (two micro-batches)")
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

CLASSES, SIZE, ACCUM = 10, 32, 2


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def drop_path(x, p, training):
    if p == 0.0 or not training:
        return x
    keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1 - p)
    return x * keep / (1 - p)


class Block(nn.Module):
    def __init__(self, dim, drop=0.0, scale=1e-6):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pwconv1, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(scale * torch.ones(dim))
        self.drop = drop

    def forward(self, x):
        y = self.norm(self.dwconv(x).permute(0, 2, 3, 1))
        y = (self.gamma * self.pwconv2(F.gelu(self.pwconv1(y)))).permute(0, 3, 1, 2)
        return x + drop_path(y, self.drop, self.training)


class ConvNeXt(nn.Module):
    def __init__(self, dims=(32, 64, 128), depths=(1, 1, 2), drop_path_rate=0.1):
        super().__init__()
        rates = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        self.downsample = nn.ModuleList([nn.Sequential(nn.Conv2d(3, dims[0], 4, stride=4), LayerNorm2d(dims[0]))])
        self.downsample.extend(nn.Sequential(LayerNorm2d(dims[i]), nn.Conv2d(dims[i], dims[i + 1], 2, stride=2)) for i in range(len(dims) - 1))
        self.stages = nn.ModuleList()
        k = 0
        for dim, depth in zip(dims, depths):
            self.stages.append(nn.Sequential(*(Block(dim, rates[k + j]) for j in range(depth))))
            k += depth
        self.norm, self.head = nn.LayerNorm(dims[-1]), nn.Linear(dims[-1], CLASSES)

    def forward(self, x):
        for down, stage in zip(self.downsample, self.stages):
            x = stage(down(x))
        return self.head(self.norm(x.mean((2, 3))))


def gratings(n, gen):
    """Class c: stripes at angle c*18 degrees, a random phase and frequency, tinted, with noise."""
    y = torch.randint(0, CLASSES, (n,), generator=gen)
    angle = (y.float() * math.pi / CLASSES)[:, None, None]
    v, u = torch.meshgrid(torch.arange(SIZE).float(), torch.arange(SIZE).float(), indexing="ij")
    freq = 0.3 + 0.4 * torch.rand(n, 1, 1, generator=gen)
    phase = 2 * math.pi * torch.rand(n, 1, 1, generator=gen)
    wave = torch.sin(freq * (u * torch.cos(angle) + v * torch.sin(angle)) + phase)
    tint = torch.rand(n, 3, 1, 1, generator=gen)
    return tint * wave[:, None] + 0.3 * torch.randn(n, 3, SIZE, SIZE, generator=gen), y


def mixup(x, y, gen, alpha=0.2):
    lam = float(torch.distributions.Beta(alpha, alpha).sample())
    perm = torch.randperm(x.shape[0], generator=gen)
    target = F.one_hot(y, CLASSES).float()
    return lam * x + (1 - lam) * x[perm], lam * target + (1 - lam) * target[perm]


hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = ConvNeXt()
decay = [p for p in model.parameters() if p.ndim > 1]
no_decay = [p for p in model.parameters() if p.ndim <= 1]  # norms, biases, layer scales
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=args.lr * hvd.size())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), backward_passes_per_step=ACCUM)
warmup = 5
sched = torch.optim.lr_scheduler.SequentialLR(opt, [torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=warmup),
                                                    torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps - warmup)], [warmup])
ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.99))
gen = torch.Generator().manual_seed(10 + hvd.rank())
model.train()
for step in range(args.steps):
    opt.zero_grad()
    for _ in range(ACCUM):
        x, y = gratings(args.batch // ACCUM, gen)
        x, soft = mixup(x, y, gen)
        loss = torch.sum(-soft * F.log_softmax(model(x), -1), -1).mean() / ACCUM
        loss.backward()
    opt.step()
    sched.step()
    ema.update_parameters(model)
    if hvd.rank() == 0 and step % 5 == 4:
        print(f"step {step}: loss {loss.item() * ACCUM:.3f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
ema.eval()
with torch.no_grad():
    x, y = gratings(128, gen)
    acc = hvd.allreduce((ema(x).argmax(-1) == y).float().mean(), name="ema_accuracy")
if hvd.rank() == 0:
    print(f"ema accuracy {acc.item():.3f}")
