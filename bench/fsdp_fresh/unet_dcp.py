"""A fresh FSDP2 user script for reviewing dagprof (issue 16): a small U-Net-style denoising conv autoencoder on 2 ranks.

Habits it exercises, as users write them (none of the other fresh scripts has them together):
- a U-Net: each encoder and decoder stage its own ``fully_shard`` unit, skip connections concatenated across units;
- ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` on every unit;
- gradient accumulation: ``set_requires_gradient_sync(False)`` on all but the last of ``--accum`` micro-batches;
- ``clip_grad_norm_`` on the DTensor gradients, ``AdamW``, ``OneCycleLR``;
- a distributed checkpoint every ``--save-every`` steps inside the profiled window:
  ``get_model_state_dict`` / ``get_optimizer_state_dict`` (``torch.distributed.checkpoint.state_dict``), then
  ``torch.distributed.checkpoint.save`` into a temporary folder (gloo, every rank writes its shards).

    dagprof profile -o runs/unet -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/unet_dcp.py --steps 12
    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/unet_dcp.py --memory /tmp/unet-mem   # each step's peak per rank
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU())


class UNet(nn.Module):
    def __init__(self, ch: int = 3, width: int = 32) -> None:
        super().__init__()
        w = width
        self.enc = nn.ModuleList([conv_block(ch, w), conv_block(w, 2 * w), conv_block(2 * w, 4 * w)])
        self.mid = conv_block(4 * w, 4 * w)
        self.up = nn.ModuleList([nn.ConvTranspose2d(4 * w, 4 * w, 2, stride=2), nn.ConvTranspose2d(2 * w, 2 * w, 2, stride=2)])
        self.dec = nn.ModuleList([conv_block(6 * w, 2 * w), conv_block(3 * w, w)])
        self.out = nn.Conv2d(w, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.enc):
            x = block(x)
            if i < 2:
                skips.append(x)
                x = F.avg_pool2d(x, 2)
        x = self.mid(x)
        for up, dec in zip(self.up, self.dec):
            x = dec(torch.cat([up(x), skips.pop()], dim=1))
        return self.out(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--size", type=int, default=16, help="image side (bf16 convolutions are slow on CPU)")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--keep-gathered", action="store_true", help="reshard_after_forward=False on every stage (what whatif --reshard-after-forward off predicts)")
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = UNet(width=args.width)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for stage in [*model.enc, model.mid, *model.dec]:
        fully_shard(stage, mp_policy=mp, reshard_after_forward=not args.keep_gathered)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=args.steps)
    g = torch.Generator().manual_seed(dist.get_rank())
    ckpt_dir = tempfile.mkdtemp(prefix="unet_dcp_") if dist.get_rank() == 0 else None
    box = [ckpt_dir]
    dist.broadcast_object_list(box, src=0)
    ckpt_dir = box[0]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    for step in range(args.steps):
        with peaks.step():
            train_step(model, opt, sched, g, args.accum, args.size)
        if args.save_every and (step + 1) % args.save_every == 0:
            state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
            dcp.save(state, checkpoint_id=os.path.join(ckpt_dir, f"step{step + 1}"))
    peaks.save(dist.get_rank())
    dist.destroy_process_group()


def train_step(model: nn.Module, opt: torch.optim.Optimizer, sched, g: torch.Generator, accum: int, size: int) -> None:
    for micro in range(accum):
        model.set_requires_gradient_sync(micro == accum - 1)
        clean = torch.rand(2, 3, size, size, generator=g)
        noisy = clean + 0.1 * torch.randn(clean.shape, generator=g)
        loss = F.mse_loss(model(noisy).float(), clean)
        (loss / accum).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
