"""A fresh HSDP user script for reviewing dagprof (issue 16): a small Swin-style windowed-attention classifier, 4 ranks.

Habits it exercises, as users write them (no other fresh script has them together):
- HSDP through ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))``: shards within pairs, replicas
  across them; each Swin stage (two blocks, the second one's windows shifted by half a window with ``torch.roll``) and
  each patch-merging layer is a unit;
- ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` on every unit (``--no-mp`` without);
- a ``TensorDataset`` of images and labels behind a ``DistributedSampler`` (``drop_last``) and a ``DataLoader``, label
  smoothing, SGD with Nesterov momentum and a ``OneCycleLR``, ``clip_grad_norm_``;
- a top-1 evaluation between epochs (counts all-reduced), a ``torch.distributed.checkpoint`` save at the end, print on
  rank 0 only.
Without a profiler it prints its median training step from step 4 on (``bench/fresh_rounds.py`` reads it).

    dagprof profile -o runs/swin -- torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/hsdp_swin.py --steps 16
    torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/hsdp_swin.py --memory /tmp/swin-mem   # each step's peak
    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/hsdp_swin.py --shard 2    # 1x2 (2x2 on 4 ranks)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def windows(x: torch.Tensor, w: int) -> torch.Tensor:
    b, h, wd, c = x.shape
    x = x.view(b, h // w, w, wd // w, w, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, w * w, c)


def unwindows(x: torch.Tensor, w: int, b: int, h: int, wd: int) -> torch.Tensor:
    c = x.shape[-1]
    x = x.view(b, h // w, wd // w, w, w, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, wd, c)


class SwinBlock(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, shift: int) -> None:
        super().__init__()
        self.window, self.shift, self.heads = window, shift, heads
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.bias = nn.Parameter(torch.zeros(heads, window * window, window * window))
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        y = self.n1(x)
        if self.shift:
            y = torch.roll(y, (-self.shift, -self.shift), dims=(1, 2))
        t = windows(y, self.window)
        q, k, v = self.qkv(t).view(t.shape[0], t.shape[1], 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias.to(q.dtype))
        t = self.proj(a.transpose(1, 2).reshape(t.shape[0], t.shape[1], c))
        y = unwindows(t, self.window, b, h, w)
        if self.shift:
            y = torch.roll(y, (self.shift, self.shift), dims=(1, 2))
        x = x + y
        return x + self.mlp(self.n2(x))


class PatchMerge(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm, self.red = nn.LayerNorm(4 * dim), nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        return self.red(self.norm(x))


class Swin(nn.Module):
    def __init__(self, dim: int = 48, window: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 2, stride=2)
        self.stages = nn.ModuleList()
        self.merges = nn.ModuleList()
        for i, heads in enumerate((3, 6, 12)):
            d = dim * 2 ** i
            self.stages.append(nn.Sequential(SwinBlock(d, heads, window, 0), SwinBlock(d, heads, window, window // 2)))
            if i < 2:
                self.merges.append(PatchMerge(d))
        self.norm = nn.LayerNorm(dim * 4)
        self.head = nn.Linear(dim * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).permute(0, 2, 3, 1)
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i < len(self.merges):
                x = self.merges[i](x)
        return self.head(self.norm(x.mean(dim=(1, 2))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--epoch-steps", type=int, default=6)
    p.add_argument("--no-mp", action="store_true", help="no MixedPrecisionPolicy")
    p.add_argument("--ckpt", default=os.path.join(tempfile.gettempdir(), "swin_dcp"))
    p.add_argument("--shard", type=int, default=0, help="the shard degree, the replicate degree the rest (default: half the ranks)")
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = args.shard or world // 2
    mesh = init_device_mesh("cpu", (world // shard, shard), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = Swin()
    mp = None if args.no_mp else MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kw = {"mesh": mesh} | ({"mp_policy": mp} if mp else {})
    for stage in model.stages:
        fully_shard(stage, **kw)
    for merge in model.merges:
        fully_shard(merge, **kw)
    fully_shard(model, **kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=args.steps)
    g = torch.Generator().manual_seed(7)
    n = args.epoch_steps * args.batch * world
    train = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    val = TensorDataset(torch.randn(args.batch * world, 3, 32, 32, generator=g), torch.randint(0, 10, (args.batch * world,), generator=g))
    sampler = DistributedSampler(train, shuffle=True, drop_last=True)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler, drop_last=True)
    val_loader = DataLoader(val, batch_size=args.batch, sampler=DistributedSampler(val, shuffle=False))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    step, epoch, times = 0, 0, []
    while step < args.steps:
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            if step >= args.steps:
                break
            t0 = time.perf_counter()
            with peaks.step():
                loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
            sched.step()
            times.append(time.perf_counter() - t0)
            if rank == 0 and step % 4 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f} lr {sched.get_last_lr()[0]:.4f}", flush=True)
            step += 1
        model.eval()
        hits = torch.zeros(2)
        with torch.no_grad():
            for x, y in val_loader:
                hits += torch.tensor([(model(x).argmax(-1) == y).sum().item(), len(y)], dtype=torch.float32)
        dist.all_reduce(hits)
        if rank == 0:
            print(f"epoch {epoch} top-1 {hits[0] / hits[1]:.3f}", flush=True)
        epoch += 1
    if rank == 0 and len(times) > 4:
        print(f"median step {1000 * statistics.median(times[4:]):.1f} ms over {len(times) - 4} steps", flush=True)
    dcp.save({"model": model.state_dict()}, checkpoint_id=args.ckpt)
    if rank == 0:
        print(f"saved checkpoint to {args.ckpt}", flush=True)
    peaks.save(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
