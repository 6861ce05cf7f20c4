"""A fresh user script for reviewing dagprof: LoRA fine-tuning of a small pretrained-style transformer.

Habits it exercises, as people fine-tune today (not dagprof's own scripts):
- the base model is frozen (``requires_grad_(False)``); only low-rank adapters on the attention and MLP projections, the
  norms and the head train, so most parameters have no gradient and no optimizer state;
- ``--wrap fsdp``: ``fully_shard`` per block then the root (FSDP2 all-gathers every parameter but reduce-scatters only
  the trainable ones); ``--wrap ddp``: ``DistributedDataParallel`` (buckets hold the trainable parameters only);
- ``--freeze-blocks K``: the first K blocks frozen whole, adapters included (a unit with nothing to reduce-scatter);
- ``AdamW`` over the trainable parameters only, ``clip_grad_norm_``, a linear warm-up.

    dagprof profile -o runs/lora -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/lora_finetune.py --steps 20
    torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/lora_finetune.py --memory /tmp/lora-mem   # each step's peak per rank
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (B starts at zero, as in the LoRA paper)."""

    def __init__(self, d_in: int, d_out: int, rank: int) -> None:
        super().__init__()
        self.base = nn.Linear(d_in, d_out)
        self.a = nn.Parameter(torch.randn(rank, d_in) / math.sqrt(d_in))
        self.b = nn.Parameter(torch.zeros(d_out, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.t()) @ self.b.t()


class Block(nn.Module):
    def __init__(self, d: int, heads: int, rank: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = LoRALinear(d, 3 * d, rank)
        self.proj = nn.Linear(d, d)
        self.up = LoRALinear(d, 4 * d, rank)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, rank: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, rank) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        x = self.embed(tok)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def freeze(model: LM, frozen_blocks: int) -> None:
    """The base weights frozen; adapters, norms and the head train, except in the first ``frozen_blocks`` blocks."""
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith((".a", ".b")) or "ln" in name or name.startswith(("norm", "head")))
    for blk in model.blocks[:frozen_blocks]:
        blk.requires_grad_(False)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--wrap", choices=("fsdp", "ddp"), default="fsdp")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--freeze-blocks", type=int, default=0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = LM(2048, args.width, args.layers, 4, args.rank)
    freeze(model, args.freeze_blocks)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=3e-4, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    gen = torch.Generator().manual_seed(dist.get_rank())
    probe = span = None
    if args.memory:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from heap_peak import HeapPeak, tensor_bytes
        probe = HeapPeak()
        span = lambda: probe.step(tensor_bytes(model, opt, args.wrap == "ddp"))  # noqa: E731
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        with span() if span else contextlib.nullcontext():
            one_step(model, opt, sched, trainable, gen, args)
        times.append(time.perf_counter() - t0)
    if probe is not None:
        with open(f"{args.memory}.{dist.get_rank()}", "w") as f:
            json.dump({"step_peak_bytes": probe.peaks}, f)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} trainable {sum(p.numel() for p in trainable)} of {sum(p.numel() for p in model.parameters())} "
              f"parameters; median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


def one_step(model: nn.Module, opt: torch.optim.Optimizer, sched, trainable: list, gen: torch.Generator, args) -> None:
    tok = torch.randint(0, 2048, (args.batch, args.seq + 1), generator=gen)
    logits = model(tok[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tok[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()


if __name__ == "__main__":
    main()
