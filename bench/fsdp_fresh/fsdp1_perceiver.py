"""A fresh FSDP1 user script for reviewing dagprof (issue 16): a small Perceiver classifier over point sets, 2 ranks.

Habits it exercises, as users write them (no other fresh script has them together):
- a Perceiver: a learned latent array cross-attends to the inputs (point clouds of 256 points, Fourier-encoded), then
  latent self-attention blocks, a second cross-attention, a mean-pooled head;
- ``FullyShardedDataParallel`` with ``size_based_auto_wrap_policy`` (``min_num_params``: whichever modules reach it are
  units, not named classes), ``forward_prefetch=True``, ``device_id=torch.device("cpu")``, flat parameters
  (``use_orig_params=False``);
- FSDP1's own ``model.clip_grad_norm_``, Adam with a ``CosineAnnealingLR`` after a ``LinearLR`` warmup
  (``SequentialLR``);
- a ``TensorDataset`` behind a ``DistributedSampler`` and a ``DataLoader``, an accuracy evaluation between epochs,
  a ``FULL_STATE_DICT`` (``rank0_only``) saved by rank 0 at the end, print on rank 0 only.

    dagprof profile -o runs/perceiver -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/fsdp1_perceiver.py --steps 20
    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/fsdp1_perceiver.py --memory /tmp/perc-mem   # each step's peak
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP, StateDictType
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Attention(nn.Module):
    def __init__(self, qdim: int, kvdim: int, heads: int) -> None:
        super().__init__()
        self.nq, self.nkv = nn.LayerNorm(qdim), nn.LayerNorm(kvdim)
        self.attn = nn.MultiheadAttention(qdim, heads, kdim=kvdim, vdim=kvdim, batch_first=True)
        self.ff = nn.Sequential(nn.LayerNorm(qdim), nn.Linear(qdim, 4 * qdim), nn.GELU(), nn.Linear(4 * qdim, qdim))

    def forward(self, q: torch.Tensor, kv: torch.Tensor | None = None) -> torch.Tensor:
        h = self.nq(q)
        kv = h if kv is None else self.nkv(kv)
        q = q + self.attn(h, kv, kv, need_weights=False)[0]
        return q + self.ff(q)


class Perceiver(nn.Module):
    def __init__(self, in_dim: int = 3, bands: int = 8, latents: int = 32, dim: int = 128, self_blocks: int = 3,
                 classes: int = 16) -> None:
        super().__init__()
        self.register_buffer("freqs", 2.0 ** torch.arange(bands) * math.pi)
        enc = in_dim * (2 * bands + 1)
        self.latents = nn.Parameter(torch.randn(latents, dim) * 0.02)
        self.cross1 = Attention(dim, enc, 1)
        self.blocks1 = nn.ModuleList(Attention(dim, dim, 4) for _ in range(self_blocks))
        self.cross2 = Attention(dim, enc, 1)
        self.blocks2 = nn.ModuleList(Attention(dim, dim, 4) for _ in range(self_blocks))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, classes))

    def forward(self, pts: torch.Tensor) -> torch.Tensor:
        f = pts.unsqueeze(-1) * self.freqs
        x = torch.cat([pts, f.sin().flatten(2), f.cos().flatten(2)], dim=-1)
        z = self.latents.expand(pts.shape[0], -1, -1)
        z = self.cross1(z, x)
        for blk in self.blocks1:
            z = blk(z)
        z = self.cross2(z, x)
        for blk in self.blocks2:
            z = blk(z)
        return self.head(z.mean(1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--points", type=int, default=256)
    p.add_argument("--epoch-steps", type=int, default=7)
    p.add_argument("--min-params", type=int, default=150_000, help="size_based_auto_wrap_policy's min_num_params")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "perceiver_full.pt"))
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = FSDP(Perceiver(), auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=args.min_params),
                 device_id=torch.device("cpu"), forward_prefetch=True)
    if rank == 0:
        units = sum(1 for m in model.modules() if isinstance(m, FSDP))
        print(f"{units} FSDP units, {sum(q.numel() for q in model.parameters()) * world} parameters", flush=True)
    opt = torch.optim.Adam(model.parameters(), lr=5e-4)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, args.steps - 3))
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])
    g = torch.Generator().manual_seed(3)
    n = args.epoch_steps * args.batch * world
    train = TensorDataset(torch.rand(n, args.points, 3, generator=g) * 2 - 1, torch.randint(0, 16, (n,), generator=g))
    m = args.batch * world
    val = TensorDataset(torch.rand(m, args.points, 3, generator=g) * 2 - 1, torch.randint(0, 16, (m,), generator=g))
    sampler = DistributedSampler(train, shuffle=True, drop_last=True)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler, drop_last=True)
    val_loader = DataLoader(val, batch_size=args.batch, sampler=DistributedSampler(val, shuffle=False))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        model.train()
        for pts, y in loader:
            if step >= args.steps:
                break
            with peaks.step():
                loss = F.cross_entropy(model(pts), y)
                loss.backward()
                model.clip_grad_norm_(1.0)
                opt.step()
                opt.zero_grad()
            sched.step()
            if rank == 0 and step % 4 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
            step += 1
        model.eval()
        hits = torch.zeros(2)
        with torch.no_grad():
            for pts, y in val_loader:
                hits += torch.tensor([(model(pts).argmax(-1) == y).sum().item(), len(y)], dtype=torch.float32)
        dist.all_reduce(hits)
        if rank == 0:
            print(f"epoch {epoch} accuracy {hits[0] / hits[1]:.3f}", flush=True)
        epoch += 1
    # offload_to_cpu=True (the tutorials' habit) fails here on CPU in torch 2.13 after an evaluation: "setStorage: ... out of
    # bounds for storage of size 0" (the parameters are on the CPU already)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=False, rank0_only=True)):
        state = model.state_dict()
    if rank == 0:
        torch.save(state, args.out)
        print(f"saved {len(state)} tensors to {args.out}", flush=True)
    peaks.save(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
