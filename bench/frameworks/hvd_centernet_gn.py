"""A user's Horovod script: a small CenterNet ("Objects as Points", Zhou et al. 2019, small: a strided convolutional
backbone to 1/8 resolution, one transposed convolution back to 1/4, and three heads on it: a per-class centre heatmap,
box width and height, and the centre's sub-pixel offset) finding discs and squares on synthetic 64x64 images.

Habits it exercises that the other Horovod scripts do not: every ``nn.BatchNorm2d`` swapped for ``nn.GroupNorm`` by a
recursive helper before training (the user first swapped in ``hvd.SyncBatchNorm``, which on CPU tensors stops the job:
"SyncBatchNorm expected input tensor to be on GPU"; small per-rank batches need a normalisation that does not depend
on them), targets rendered per batch (Gaussian centre peaks with the paper's radius, box sizes and offsets at the
centre cells only, an index mask), the paper's penalty-reduced focal loss on the heatmap beside L1 losses gathered at
the centres, the heatmap head's bias set to -2.19 (a prior of 0.1), SGD with Nesterov momentum under a
``PolynomialLR`` schedule, and a decode of the peaks (3x3 max pooling as non-maximum suppression, top-k) whose counts
every rank ``hvd.allgather``-s at the end. No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_centernet_gn.py``.
"""
import argparse
import math

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod CenterNet, synthetic shapes, GroupNorm")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch", type=int, default=16, help="per rank")
parser.add_argument("--lr", type=float, default=0.02)
args = parser.parse_args()

CLASSES, SIZE, STRIDE, OBJECTS = 2, 64, 4, 3
OUT = SIZE // STRIDE


def conv_bn(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class CenterNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(conv_bn(3, 16, 2), conv_bn(16, 32, 2), conv_bn(32, 32, 1), conv_bn(32, 64, 2), conv_bn(64, 64, 1))
        self.up = nn.Sequential(nn.ConvTranspose2d(64, 48, 4, 2, 1, bias=False), nn.BatchNorm2d(48), nn.ReLU(inplace=True))
        head = lambda out: nn.Sequential(nn.Conv2d(48, 32, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(32, out, 1))  # noqa: E731
        self.heatmap, self.wh, self.offset = head(CLASSES), head(2), head(2)
        self.heatmap[-1].bias.data.fill_(-2.19)

    def forward(self, x):
        f = self.up(self.backbone(x))
        return torch.sigmoid(self.heatmap(f)).clamp(1e-4, 1 - 1e-4), self.wh(f), self.offset(f)


def to_group_norm(module, groups=8):
    """Every BatchNorm2d below ``module`` as a ``GroupNorm`` of ``groups`` groups over the same channels."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, nn.GroupNorm(groups, child.num_features, eps=child.eps))
        else:
            to_group_norm(child, groups)
    return module


def gaussian_radius(h, w, overlap=0.7):
    b = h + w
    return max(0, int((b - math.sqrt(b * b - 4 * (1 - overlap) / (1 + overlap) * w * h)) / 4))


def batch(n, rng):
    """Images with 1-3 shapes (class 0 a disc, 1 a square) and CenterNet's targets at 1/STRIDE resolution."""
    img = 0.15 * rng.standard_normal((n, 3, SIZE, SIZE)).astype(np.float32)
    heat = np.zeros((n, CLASSES, OUT, OUT), np.float32)
    wh, off = np.zeros((n, OBJECTS, 2), np.float32), np.zeros((n, OBJECTS, 2), np.float32)
    ind, mask = np.zeros((n, OBJECTS), np.int64), np.zeros((n, OBJECTS), np.float32)
    yy, xx = np.mgrid[:SIZE, :SIZE]
    gy, gx = np.mgrid[:OUT, :OUT]
    for i in range(n):
        for k in range(int(rng.integers(1, OBJECTS + 1))):
            cls, s = int(rng.integers(CLASSES)), int(rng.integers(8, 20))
            cx, cy = rng.uniform(s / 2, SIZE - s / 2, 2)
            inside = ((xx - cx) ** 2 + (yy - cy) ** 2 <= (s / 2) ** 2) if cls == 0 else ((abs(xx - cx) <= s / 2) & (abs(yy - cy) <= s / 2))
            img[i][:, inside] += rng.uniform(0.5, 1.0, (3, 1)).astype(np.float32)
            c = np.array([cx, cy]) / STRIDE
            ci = c.astype(int)
            sigma = (2 * gaussian_radius(s / STRIDE, s / STRIDE) + 1) / 6
            heat[i, cls] = np.maximum(heat[i, cls], np.exp(-((gx - ci[0]) ** 2 + (gy - ci[1]) ** 2) / (2 * sigma * sigma)))
            wh[i, k], off[i, k], ind[i, k], mask[i, k] = (s, s), c - ci, ci[1] * OUT + ci[0], 1.0
    return [torch.from_numpy(a) for a in (img, heat, wh, off, ind, mask)]


def focal(pred, gt):
    pos = gt.eq(1).float()
    neg_weight = torch.pow(1 - gt, 4)
    pos_loss = torch.log(pred) * torch.pow(1 - pred, 2) * pos
    neg_loss = torch.log(1 - pred) * torch.pow(pred, 2) * neg_weight * (1 - pos)
    return -(pos_loss.sum() + neg_loss.sum()) / pos.sum().clamp(min=1)


def gathered_l1(pred, target, ind, mask):
    feat = pred.flatten(2).transpose(1, 2).gather(1, ind[..., None].expand(-1, -1, 2))  # (B, OBJECTS, 2)
    return (F.l1_loss(feat, target, reduction="none") * mask[..., None]).sum() / (mask.sum() * 2 + 1e-4)


hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = to_group_norm(CenterNet())
opt = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9, nesterov=True, weight_decay=1e-4)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
sched = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=args.steps, power=0.9)
rng = np.random.default_rng(40 + hvd.rank())
model.train()
for step in range(args.steps):
    img, heat, wh, off, ind, mask = batch(args.batch, rng)
    pred_heat, pred_wh, pred_off = model(img)
    loss = focal(pred_heat, heat) + 0.1 * gathered_l1(pred_wh, wh, ind, mask) + gathered_l1(pred_off, off, ind, mask)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if hvd.rank() == 0 and step % 5 == 4:
        print(f"step {step}: loss {loss.item():.3f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
model.eval()
with torch.no_grad():
    img, heat, *_ = batch(8, rng)
    peaks = model(img)[0]
    keep = (peaks == F.max_pool2d(peaks, 3, 1, 1)) & (peaks > 0.3)
    found = hvd.allgather(keep.flatten(1).sum(1), name="detections")
if hvd.rank() == 0:
    print(f"detections per image {found.float().mean().item():.2f} (truth {heat.eq(1).flatten(1).sum(1).float().mean().item():.2f})")
