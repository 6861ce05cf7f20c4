"""A user's small GPU training script (DDP or FSDP2) for recording real CUDA traces with dagprof on a GPU machine.

Written as a user writes one: a byte-level language model (embedding, pre-norm transformer blocks, tied head) trained
with AdamW, wrapped in DistributedDataParallel or ``fully_shard``. It knows nothing of dagprof: record it with
``dagprof profile -o RUN -- torchrun --nproc-per-node N bench/gpu/cuda_train.py ...``. ``--backend gloo`` lets several
ranks share one GPU (NCCL refuses two ranks on one device); ``--stats FILE`` writes rank 0's step times and every rank's
``torch.cuda.max_memory_allocated`` after warm-up, the measurement a memory prediction is held against.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ByteLM(nn.Module):
    def __init__(self, vocab: int, width: int, depth: int, heads: int, seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.t()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    p.add_argument("--no-reshard", action="store_true", help="FSDP: keep each block gathered after forward")
    p.add_argument("--stats", metavar="FILE")
    args = p.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = torch.cuda.is_available()  # a CPU machine runs it too (gloo), to try the script before a GPU run
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = ByteLM(256, args.width, args.depth, 16, args.seq).to(device)
    if args.wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None, bucket_cap_mb=args.bucket_mb)
    else:
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block, reshard_after_forward=not args.no_reshard)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=device).manual_seed(rank)
    times = []
    for step in range(args.steps):
        if step == args.steps // 3 and cuda:
            torch.cuda.reset_peak_memory_stats(device)
        tokens = torch.randint(0, 256, (args.batch, args.seq + 1), device=device, generator=gen)
        start = time.perf_counter()
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    peak = torch.tensor([torch.cuda.max_memory_allocated(device) if cuda else 0], device=device, dtype=torch.int64)
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    if rank == 0 and args.stats:
        with open(args.stats, "w") as f:
            json.dump({"step_s": times, "max_memory_allocated": [int(t.item()) for t in peaks], "world": world,
                       "wrap": args.wrap, "backend": args.backend, "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name(device) if cuda else None}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
