"""A fresh FSDP1 user script for reviewing dagprof (issue 16): a pre-LN transformer classifier, FSDP1 ``SHARD_GRAD_OP``.

Habits it exercises, as users write them (none of the other fresh scripts has them together):
- ``auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Layer})`` on the user's own
  layer class (not torch's ``nn.TransformerEncoderLayer``);
- ``ShardingStrategy.SHARD_GRAD_OP`` (ZeRO-2: parameters stay gathered from forward to backward), ``use_orig_params=True``,
  ``device_id=torch.device("cpu")``, ``limit_all_gathers=True``;
- a frozen, pre-trained-style token embedding (``requires_grad_(False)`` before wrapping) in the root unit beside
  trained parameters (a learned position table, the head), which ``use_orig_params=True`` allows;
- ``Adam`` over the trainable parameters only (``filter(lambda p: p.requires_grad, ...)``), FSDP1's own
  ``model.clip_grad_norm_``, a ``CosineAnnealingLR``, ``zero_grad()`` before the forward.

    dagprof profile -o runs/sgo -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/fsdp1_sgo_frozen.py --steps 20
    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/fsdp1_sgo_frozen.py --memory /tmp/sgo-mem   # peak per rank
    torchrun ... fsdp1_sgo_frozen.py --wrap ddp [--memory FILE]   # the same job under DDP
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

VOCAB, SEQ, DIM, HEADS, CLASSES = 4096, 48, 128, 4, 5


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Classifier(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(1, SEQ, DIM))
        self.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.head = nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, CLASSES))

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        x = self.tok(tok) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--wrap", choices=["fsdp1", "ddp"], default="fsdp1", help="ddp: the same job under DDP (what `whatif --data-parallel ddp` predicts)")
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(7)
    model = Classifier(args.layers)
    model.tok.weight.requires_grad_(False)          # "pre-trained", kept frozen
    if args.wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        model = FSDP(model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Layer}),
                     sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, use_orig_params=True,
                     device_id=torch.device("cpu"), limit_all_gathers=True)
    opt = torch.optim.Adam(filter(lambda q: q.requires_grad, model.parameters()), lr=3e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    g = torch.Generator().manual_seed(100 + rank)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt, ddp=args.wrap == "ddp")
    for step in range(args.steps):
        tok = torch.randint(0, VOCAB, (args.batch, SEQ), generator=g)
        y = torch.randint(0, CLASSES, (args.batch,), generator=g)
        with peaks.step():
            opt.zero_grad()
            loss = F.cross_entropy(model(tok), y)
            loss.backward()
            if args.wrap == "fsdp1":
                model.clip_grad_norm_(0.5)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
        sched.step()
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    peaks.save(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
