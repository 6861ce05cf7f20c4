"""A fresh DDP user script for reviewing dagprof: a small U-Net denoiser trained with the habits real loops have.

Habits it exercises, as users write them (each can be turned off with ``--no-habits`` for a diff):
- a map-style synthetic Dataset behind a ``DistributedSampler`` (``set_epoch`` each epoch) and a ``DataLoader``
  (``--loader-workers 0`` or ``2``);
- every step: ``clip_grad_norm_``, ``optimizer.step()``, ``scheduler.step()`` (OneCycleLR), then the loss
  all-reduced for logging (``dist.all_reduce(loss.detach())``) and printed on rank 0;
- every ``--ckpt-every`` steps: rank 0 ``torch.save``s the model and optimizer state, then ``dist.barrier()``
  (the other ranks wait for the checkpoint);
- every ``--eval-every`` steps: an evaluation pass under ``torch.no_grad()`` over ``--eval-batches`` batches, its
  summed error all-reduced (a metric all-reduce).

    dagprof profile -o runs/habits --steps 4:12 -- torchrun --nproc-per-node 2 bench/ddp_fresh/habits_loop.py --steps 16
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class NoisyImages(Dataset):
    """Smooth random images and their noisy copies, the same for every rank (seeded by index)."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        clean = F.interpolate(torch.rand(1, 1, self.size // 4, self.size // 4, generator=g), size=self.size,
                              mode="bilinear", align_corners=False)[0]
        return clean + 0.2 * torch.randn(clean.shape, generator=g), clean


def block(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU())


class UNet(nn.Module):
    """Two levels down, two up, skip connections by concatenation; predicts the noise."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.enc1, self.enc2, self.mid = block(1, c), block(c, 2 * c), block(2 * c, 4 * c)
        self.up2, self.dec2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, 2), block(4 * c, 2 * c)
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * c, c, 2, 2), block(2 * c, c)
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return x - self.out(d1)


def evaluate(model: nn.Module, loader: DataLoader, batches: int) -> float:
    model.eval()
    total = torch.zeros(2)
    with torch.no_grad():
        for k, (noisy, clean) in enumerate(loader):
            if k == batches:
                break
            total += torch.stack([F.mse_loss(model(noisy), clean, reduction="sum"), torch.tensor(float(clean.numel()))])
    dist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--loader-workers", type=int, default=0)
    ap.add_argument("--ckpt-every", type=int, default=4)
    ap.add_argument("--eval-every", type=int, default=6)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    ap.add_argument("--no-habits", action="store_true", help="no logging all-reduce, print, checkpoint or evaluation")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(UNet(args.width), bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=args.steps)
    train = NoisyImages(64 * args.batch, args.size)
    sampler = DistributedSampler(train, shuffle=True, seed=1)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler, num_workers=args.loader_workers, drop_last=True,
                        persistent_workers=args.loader_workers > 0)
    held = NoisyImages(8 * args.batch, args.size)
    eval_loader = DataLoader(held, batch_size=args.batch, sampler=DistributedSampler(held, shuffle=False))
    ckpt = os.path.join(tempfile.gettempdir(), f"habits_loop_{os.getpid()}.pt")
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for noisy, clean in loader:
            loss = F.mse_loss(model(noisy), clean)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            opt.step()
            sched.step()
            step += 1
            if not args.no_habits:
                logged = loss.detach().clone()
                dist.all_reduce(logged)
                if rank == 0:
                    print(f"step {step} epoch {epoch} loss {logged.item() / world:.4f} lr {sched.get_last_lr()[0]:.2e}",
                          flush=True)
                if step % args.ckpt_every == 0:
                    if rank == 0:
                        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
                    dist.barrier()
                if step % args.eval_every == 0:
                    mse = evaluate(model, eval_loader, args.eval_batches)
                    if rank == 0:
                        print(f"step {step} eval mse {mse:.4f}", flush=True)
            if step == args.steps:
                break
        epoch += 1
    if rank == 0 and os.path.exists(ckpt):
        os.remove(ckpt)
    dist.barrier()  # no rank tears gloo down while a peer's last all-reduce is in flight (at 200 Mbit/s one aborted)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
