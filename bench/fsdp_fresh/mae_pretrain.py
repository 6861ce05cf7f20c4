"""A fresh FSDP2 user script for reviewing dagprof (issue 16): masked-autoencoder (MAE) pre-training on 2 ranks.

Habits it exercises, as users write them (no other fresh script has them together):
- a ViT encoder that sees only the visible 25 % of the patches (a random shuffle per image, ``torch.gather``), a narrower
  decoder with mask tokens, the loss on the masked patches only (per-patch normalised pixels);
- ``fully_shard`` per block with ``reshard_after_forward`` set per unit: the encoder's blocks reshard (True), the
  decoder's keep their gathered parameters (False), the root the default;
- a ``TensorDataset`` behind a ``DistributedSampler`` and a ``DataLoader``, ``set_epoch`` each epoch, an evaluation
  (masked loss under ``torch.no_grad``, all-reduced) between epochs;
- AdamW with a warmup-then-cosine ``LambdaLR``, ``clip_grad_norm_`` on the DTensor gradients;
- ``--units root``: ``fully_shard`` on the root only (what ``whatif --units merge:all`` predicts), for
  ``mae_units_rounds.sh``; rank 0 prints the median training step (evaluations aside) at the end;
- a full state dict gathered (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``) and saved by rank 0 at
  the end; print on rank 0 only.

    dagprof profile -o runs/mae -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/mae_pretrain.py --steps 20
    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/mae_pretrain.py --memory /tmp/mae-mem   # each step's peak
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.n1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.n2(x))


class MAE(nn.Module):
    def __init__(self, img: int = 32, patch: int = 4, dim: int = 128, depth: int = 4, ddim: int = 64, ddepth: int = 2,
                 mask_ratio: float = 0.75) -> None:
        super().__init__()
        self.patch, self.n = patch, (img // patch) ** 2
        self.keep = int(self.n * (1 - mask_ratio))
        pdim = 3 * patch * patch
        self.embed = nn.Linear(pdim, dim)
        self.pos = nn.Parameter(torch.randn(1, self.n, dim) * 0.02)
        self.encoder = nn.ModuleList(Block(dim, 4) for _ in range(depth))
        self.enorm = nn.LayerNorm(dim)
        self.to_dec = nn.Linear(dim, ddim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, ddim))
        self.dpos = nn.Parameter(torch.randn(1, self.n, ddim) * 0.02)
        self.decoder = nn.ModuleList(Block(ddim, 4) for _ in range(ddepth))
        self.dnorm = nn.LayerNorm(ddim)
        self.head = nn.Linear(ddim, pdim)

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch
        b, c, h, w = x.shape
        x = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(b, self.n, p * p * c)

    def forward(self, imgs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        target = self.patchify(imgs)
        x = self.embed(target) + self.pos
        order = noise.argsort(dim=1)
        restore = order.argsort(dim=1)
        vis = order[:, : self.keep]
        x = torch.gather(x, 1, vis.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        for blk in self.encoder:
            x = blk(x)
        x = self.to_dec(self.enorm(x))
        masks = self.mask_token.expand(x.shape[0], self.n - self.keep, -1)
        x = torch.cat([x, masks], dim=1)
        x = torch.gather(x, 1, restore.unsqueeze(-1).expand(-1, -1, x.shape[-1])) + self.dpos
        for blk in self.decoder:
            x = blk(x)
        pred = self.head(self.dnorm(x))
        mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
        target = (target - mean) / (var + 1e-6).sqrt()
        masked = torch.ones_like(noise).scatter_(1, vis, 0.0)
        return (((pred - target) ** 2).mean(-1) * masked).sum() / masked.sum()


def warmup_cosine(warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    return f


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epoch-steps", type=int, default=8, help="training steps an epoch (an evaluation after each)")
    p.add_argument("--encoder-reshard", choices=("on", "off"), default="on")
    p.add_argument("--units", choices=("blocks", "root"), default="blocks", help="root: fully_shard on the root only")
    p.add_argument("--lr", type=float, default=1.5e-4)
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "mae_ckpt.pt"))
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = MAE()
    for blk in model.encoder if args.units == "blocks" else ():
        fully_shard(blk, reshard_after_forward=args.encoder_reshard == "on")
    for blk in model.decoder if args.units == "blocks" else ():
        fully_shard(blk, reshard_after_forward=False)
    fully_shard(model)
    decay = [q for n, q in model.named_parameters() if q.ndim >= 2 and "pos" not in n and "token" not in n]
    no_decay = [q for n, q in model.named_parameters() if not (q.ndim >= 2 and "pos" not in n and "token" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr * args.batch * world / 256, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(4, args.steps))
    g = torch.Generator().manual_seed(1234)
    n_train = args.epoch_steps * args.batch * world
    train = TensorDataset(torch.randn(n_train, 3, 32, 32, generator=g))
    val = TensorDataset(torch.randn(2 * args.batch * world, 3, 32, 32, generator=g))
    sampler = DistributedSampler(train, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler, drop_last=True)
    val_loader = DataLoader(val, batch_size=args.batch, sampler=DistributedSampler(val, shuffle=False))
    noise_gen = torch.Generator().manual_seed(rank)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    step, epoch, times = 0, 0, []
    while step < args.steps:
        sampler.set_epoch(epoch)
        model.train()
        t0 = None  # steps timed start to start (the batch's loading in), not across an evaluation
        for (imgs,) in loader:
            if t0 is not None:
                times.append(time.perf_counter() - t0)
            if step >= args.steps:
                break
            t0 = time.perf_counter()
            with peaks.step():
                loss = model(imgs, torch.rand(imgs.shape[0], model.n, generator=noise_gen))
                loss.backward()
                gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()
            sched.step()
            if rank == 0 and step % 4 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} grad-norm {float(gnorm):.3f} "
                      f"lr {sched.get_last_lr()[0]:.2e}", flush=True)
            step += 1
        model.eval()
        total = torch.zeros(2)
        with torch.no_grad():
            for (imgs,) in val_loader:
                total += torch.tensor([model(imgs, torch.rand(imgs.shape[0], model.n, generator=noise_gen)).item(), 1.0])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} eval masked loss {total[0] / total[1]:.4f}", flush=True)
        epoch += 1
    if rank == 0:
        print(f"median step {statistics.median(times[3:]) * 1e3:.1f} ms ({len(times) - 3} training steps after warm-up)", flush=True)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(state, args.out)
        print(f"saved {len(state)} tensors to {args.out}", flush=True)
    peaks.save(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
