"""A fresh DDP user script for reviewing dagprof: ZeRO-1 (``ZeroRedundancyOptimizer``) over AdamW.

Habits it exercises, as users write them:
- ``ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=...)``: each rank keeps and
  steps the AdamW state of its own shard of the parameters, then every rank broadcasts the parameters it owns
  (one ``broadcast`` per parameter, all in flight, waited at the end of ``step()``);
- a 1-D convolutional keyword-spotting classifier on log-mel frames (Conv1d + BatchNorm1d + GELU blocks with
  residuals, global average pooling), so DDP also broadcasts BatchNorm's buffers each forward;
- a OneCycle LR schedule (``cycle_momentum=False``: ZeRO's ``param_groups`` carry no ``betas``), ``clip_grad_norm_``, ``zero_grad(set_to_none=True)``.

    dagprof profile -o runs/zero1 -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/zero1_adam.py --steps 30
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(nn.Module):
    def __init__(self, ch: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(ch, ch, kernel, padding=dilation * (kernel - 1) // 2, dilation=dilation)
        self.norm = nn.BatchNorm1d(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.norm(self.conv(x)))


class KeywordNet(nn.Module):
    def __init__(self, mels: int, ch: int, blocks: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv1d(mels, ch, 5, stride=2, padding=2)
        self.blocks = nn.Sequential(*[Block(ch, 9, 2 ** (i % 3)) for i in range(blocks)])
        self.head = nn.Sequential(nn.Linear(ch, ch), nn.GELU(), nn.Dropout(0.1), nn.Linear(ch, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=-1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--channels", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--frames", type=int, default=100, help="log-mel frames per clip (1 s at 10 ms hops)")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(KeywordNet(40, args.channels, args.blocks, 12), bucket_cap_mb=args.bucket_cap_mb)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=args.lr,
                                  weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps,
                                                cycle_momentum=False)  # ZeRO's param_groups carry no betas
    torch.manual_seed(1 + rank)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        x, y = torch.randn(args.batch, 40, args.frames), torch.randint(0, 12, (args.batch,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        tail = sorted(times[5:])
        print(f"zero1_adam: {args.steps} steps, {n / 1e6:.2f} M params, loss {loss.item():.3f}, "
              f"median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
