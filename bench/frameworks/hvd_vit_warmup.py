"""A user's Horovod script: a small vision transformer (a strided ``Conv2d`` patch embedding, a class token, a learned
position table, 3 pre-norm blocks of ``nn.MultiheadAttention`` and a GELU MLP, a LayerNorm + Linear head) on
synthetic 32x32 images, label-smoothed cross entropy, AdamW.

Habits it exercises that the other Horovod scripts do not: the learning-rate warm-up of Horovod's ImageNet example (the
rate scaled by ``hvd.size()`` and ramped up linearly over the first steps by ``LambdaLR``), ``hvd.broadcast_parameters``
of ``model.state_dict()`` and ``hvd.broadcast_optimizer_state`` before training, the example's ``Metric`` class (the
loss and accuracy averaged over the workers by ``hvd.allreduce(value, name=...)`` after every step, as that example's
``train()`` does), ``DistributedOptimizer(..., op=hvd.Average, compression=hvd.Compression.none)`` spelled out, and
``no_decay`` parameter groups (biases, norms, the class token and position table without weight decay). No dagprof
line: ``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_vit_warmup.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod ViT")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--base-lr", type=float, default=5e-4)
parser.add_argument("--warmup-steps", type=int, default=5)
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, image=32, patch=4, dim=96, depth=3, heads=4, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, (image // patch) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.size(0), -1, -1), x], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class Metric:
    """Horovod's ImageNet example's running average, each value all-reduced over the workers."""

    def __init__(self, name):
        self.name, self.sum, self.n = name, torch.tensor(0.0), torch.tensor(0.0)

    def update(self, val):
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        self.n += 1

    @property
    def avg(self):
        return self.sum / self.n


model = ViT()
decay = [p for n, p in model.named_parameters() if p.ndim > 1 and n not in ("cls_token", "pos_embed")]
no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and n not in ("cls_token", "pos_embed"))]
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                              lr=args.base_lr * hvd.size())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average,
                                     compression=hvd.Compression.none)
# from base_lr to base_lr * size over the warm-up, as the example's adjust_learning_rate
warmup = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda s: (s * (hvd.size() - 1) / args.warmup_steps + 1) / hvd.size() if s < args.warmup_steps else 1.0)

g = torch.Generator().manual_seed(7 + hvd.rank())
images = torch.randn(args.batch_size * 8, 3, 32, 32, generator=g)
labels = torch.randint(0, 10, (args.batch_size * 8,), generator=g)
train_loss, train_acc = Metric("train_loss"), Metric("train_accuracy")
model.train()
for step in range(args.steps):
    i = (step % 8) * args.batch_size
    x, y = images[i:i + args.batch_size], labels[i:i + args.batch_size]
    optimizer.zero_grad()
    out = model(x)
    loss = F.cross_entropy(out, y, label_smoothing=0.1)
    loss.backward()
    optimizer.step()
    warmup.step()
    train_loss.update(loss)
    train_acc.update((out.argmax(1) == y).float().mean())
    if step % 5 == 0 and hvd.rank() == 0:
        print(f"step {step} loss {train_loss.avg.item():.3f} acc {train_acc.avg.item():.3f} lr {warmup.get_last_lr()[0]:.2e}", flush=True)
