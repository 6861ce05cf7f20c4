"""A fresh DDP user script for reviewing dagprof: a convnet whose BatchNorm layers are synchronised across ranks.

Habits it exercises, as users write them:
- synchronised BatchNorm, converted before DDP as ``nn.SyncBatchNorm.convert_sync_batchnorm`` does: every
  BatchNorm2d's forward all-gathers its batch statistics (mean, variance, count) from every rank, and its backward
  all-reduces the two gradient sums, so small collectives run inside the forward and backward passes beside DDP's
  gradient buckets. torch's own ``nn.SyncBatchNorm`` refuses CPU modules (DDP: "SyncBatchNorm layers only work with
  GPU modules"; its kernels ``batch_norm_stats`` have no CPU implementation), so ``CpuSyncBatchNorm`` issues its
  collectives as it does: ``all_gather_into_tensor`` of (2C+1) floats in forward, ``all_reduce`` of 2C in backward;
- DDP with ``bucket_cap_mb=5``; SGD with Nesterov momentum and a cosine schedule; ``zero_grad(set_to_none=True)``;
- channels-last input as vision users write it.

    dagprof profile -o runs/syncbn -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/syncbn_convnet.py --steps 30
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class _SyncBN(torch.autograd.Function):
    """nn.SyncBatchNorm's autograd function (``torch.nn.modules._functions.SyncBatchNorm``) in CPU ops."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):  # type: ignore[override]
        c = x.shape[1]
        count = torch.tensor([x.numel() / c], dtype=x.dtype)
        local = torch.cat([x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False), count])
        gathered = torch.empty(dist.get_world_size() * local.numel(), dtype=x.dtype)
        dist.all_gather_into_tensor(gathered, local)
        mean_r, var_r, n_r = gathered.view(-1, 2 * c + 1).split([c, c, 1], dim=1)
        n = n_r.sum()
        mean = (n_r * mean_r).sum(0) / n
        var = (n_r * (var_r + (mean_r - mean) ** 2)).sum(0) / n
        running_mean.mul_(1 - momentum).add_(momentum * mean)
        running_var.mul_(1 - momentum).add_(momentum * var * n / (n - 1))
        invstd = (var + eps).rsqrt()
        xhat = (x - mean[None, :, None, None]) * invstd[None, :, None, None]
        ctx.save_for_backward(xhat, weight, invstd, n)
        return xhat * weight[None, :, None, None] + bias[None, :, None, None]

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        xhat, weight, invstd, n = ctx.saved_tensors
        c = dy.shape[1]
        sums = torch.cat([dy.sum((0, 2, 3)), (dy * xhat).sum((0, 2, 3))])
        grad_weight, grad_bias = sums[c:].clone(), sums[:c].clone()
        dist.all_reduce(sums)
        mean_dy, mean_dy_xhat = (sums / n).split(c)
        dx = (weight * invstd)[None, :, None, None] * (
            dy - mean_dy[None, :, None, None] - xhat * mean_dy_xhat[None, :, None, None])
        return dx, grad_weight, grad_bias, None, None, None, None


class CpuSyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d over the whole global batch in training, like nn.SyncBatchNorm; local statistics in eval."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        self.num_batches_tracked.add_(1)
        return _SyncBN.apply(x, self.weight, self.bias, self.running_mean, self.running_var, self.eps, self.momentum)

    @classmethod
    def convert(cls, module: nn.Module) -> nn.Module:
        """Every BatchNorm2d in ``module`` made synchronised, its parameters and statistics kept."""
        if isinstance(module, nn.BatchNorm2d):
            out = cls(module.num_features, module.eps, module.momentum)
            out.load_state_dict(module.state_dict())
            return out
        for name, child in module.named_children():
            setattr(module, name, cls.convert(child))
        return module


def conv_bn(cin: int, cout: int, stride: int = 1) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Residual(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(ch, ch), nn.Conv2d(ch, ch, 3, 1, 1, bias=False), nn.BatchNorm2d(ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.body(x))


class ConvNet(nn.Module):
    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            conv_bn(3, width), Residual(width),
            conv_bn(width, 2 * width, 2), Residual(2 * width),
            conv_bn(2 * width, 4 * width, 2), Residual(4 * width),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--bucket-cap-mb", type=float, default=5.0)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = CpuSyncBatchNorm.convert(ConvNet(args.width, 10)).to(memory_format=torch.channels_last)
    model = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    torch.manual_seed(1 + rank)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        x = torch.randn(args.batch, 3, args.size, args.size).to(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (args.batch,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        tail = sorted(times[5:])
        print(f"syncbn_convnet: {args.steps} steps, {n / 1e6:.2f} M params, loss {loss.item():.3f}, "
              f"median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
