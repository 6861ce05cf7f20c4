"""A fresh FSDP2 user script for reviewing dagprof (issue 16): a small ViT-style image classifier on 2 ranks.

Habits it exercises, as users write them (none of the other fresh scripts has them):
- explicit prefetch: each block ``set_modules_to_forward_prefetch`` the next ``--prefetch`` blocks and
  ``set_modules_to_backward_prefetch`` the ones before (torchtitan's habit), ``--prefetch 0`` FSDP2's implicit order;
- ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32, cast_forward_inputs=True)``, the root's with ``output_dtype=fp32``;
- ``CPUOffloadPolicy(pin_memory=False)`` on every unit (``--no-offload`` without);
- ``model.unshard(async_op=True)`` by hand at each step's start, while the batch is made;
- the loss outside the model (soft-target cross-entropy of mixup'd labels), ``Adam(foreach=False)``, ``StepLR``;
- a plain ``state_dict`` save every ``--save-every`` steps: every rank gathers the DTensors (``full_tensor``), rank 0 writes
  it with ``torch.save`` (no ``torch.distributed.checkpoint``).

    dagprof profile -o runs/vit -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/prefetch_offload.py --steps 12
    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/prefetch_offload.py --memory /tmp/vit-mem   # each step's peak
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    def __init__(self, d: int, depth: int, classes: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, stride=4)
        self.pos = nn.Parameter(torch.zeros(1, 64, d))
        self.blocks = nn.ModuleList(Block(d, 4) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.patch(img).flatten(2).transpose(1, 2) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x).mean(1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--prefetch", type=int, default=2, help="blocks each block prefetches explicitly (0: FSDP2's implicit prefetch)")
    p.add_argument("--no-offload", dest="offload", action="store_false")
    p.add_argument("--keep-gathered", action="store_true", help="reshard_after_forward=False on the blocks (whatif --reshard-after-forward off)")
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = ViT(args.width, args.depth, 100)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=True)
    offload = {"offload_policy": CPUOffloadPolicy(pin_memory=False)} if args.offload else {}
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp, reshard_after_forward=not args.keep_gathered, **offload)
    # fp32 logits out of the root only (a block's output_dtype would hand the root's bf16 norm fp32 activations)
    fully_shard(model, mp_policy=dataclasses.replace(mp, output_dtype=torch.float32), **offload)
    if args.prefetch:
        blocks = list(model.blocks)
        for i, blk in enumerate(blocks):
            if blocks[i + 1:i + 1 + args.prefetch]:
                blk.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + args.prefetch])
            if blocks[max(0, i - args.prefetch):i]:
                blk.set_modules_to_backward_prefetch(blocks[max(0, i - args.prefetch):i][::-1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)
    gen = torch.Generator().manual_seed(rank)
    out_dir = tempfile.mkdtemp(prefix="vit_ckpt_") if rank == 0 else ""
    probe = span = None
    if args.memory:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from heap_peak import HeapPeak, tensor_bytes
        probe = HeapPeak()
        span = lambda: probe.step(tensor_bytes(model, opt, False))  # noqa: E731
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        with span() if span else contextlib.nullcontext():
            model.unshard(async_op=True)   # the root's all-gather starts while the batch is made
            img = torch.randn(16, 3, 32, 32, generator=gen)
            labels = F.one_hot(torch.randint(0, 100, (16,), generator=gen), 100).float()
            lam = 0.8
            img, labels = lam * img + (1 - lam) * img.flip(0), lam * labels + (1 - lam) * labels.flip(0)   # mixup
            logits = model(img)
            loss = torch.sum(-labels * F.log_softmax(logits, dim=-1), dim=-1).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
        times.append(time.perf_counter() - t0)
        if (step + 1) % args.save_every == 0:
            state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
            if rank == 0:
                torch.save(state, os.path.join(out_dir, f"vit-{step + 1}.pt"))
    if probe is not None:
        with open(f"{args.memory}.{rank}", "w") as f:
            json.dump({"step_peak_bytes": probe.peaks}, f)
    if rank == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"prefetch {args.prefetch} offload {args.offload}: loss {loss.item():.3f}, median step {1e3 * tail[len(tail) // 2]:.1f} ms, "
              f"checkpoints in {out_dir}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
