"""A fresh DDP user script for reviewing dagprof: CLIP-style contrastive training of a two-tower model.

Habits it exercises, as users write them:
- a text tower (``nn.Embedding`` + mean pool over the non-padding tokens + an MLP) and an image-feature tower (an MLP
  over precomputed image features), each projected to a shared embedding, L2-normalised, and a learnable temperature;
- the contrastive loss over every rank's batch: the module's ``forward`` all-gathers both embeddings with the
  differentiable ``torch.distributed.nn.functional.all_gather`` (its backward exchanges the gathered gradients: an
  all-to-all under gloo), so collectives run in the forward and backward passes beside DDP's gradient buckets;
- AdamW with weight decay off for the temperature, ``clip_grad_norm_``, ``zero_grad(set_to_none=True)``.

    dagprof profile -o runs/clip -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/clip_contrastive.py --steps 30
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class TextTower(nn.Module):
    def __init__(self, vocab: int, width: int, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width), nn.Linear(width, dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = (tokens != 0).unsqueeze(-1).float()
        pooled = (self.embed(tokens) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.mlp(pooled)


class ImageTower(nn.Module):
    def __init__(self, features: int, width: int, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(features, width), nn.GELU(), nn.LayerNorm(width),
                                 nn.Linear(width, width), nn.GELU(), nn.Linear(width, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


class Clip(nn.Module):
    """Both towers and the loss: the batch's embeddings against every rank's (the global contrastive batch)."""

    def __init__(self, vocab: int, features: int, width: int, dim: int) -> None:
        super().__init__()
        self.text, self.image = TextTower(vocab, width, dim), ImageTower(features, 2 * width, dim)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, tokens: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        t = F.normalize(self.text(tokens), dim=-1)
        i = F.normalize(self.image(images), dim=-1)
        all_t = torch.cat(dist_fn.all_gather(t), dim=0)  # differentiable: gradients flow back to every rank's tower
        all_i = torch.cat(dist_fn.all_gather(i), dim=0)
        scale = self.logit_scale.exp().clamp(max=100.0)
        labels = torch.arange(len(t)) + dist.get_rank() * len(t)
        return 0.5 * (F.cross_entropy(scale * i @ all_t.T, labels) + F.cross_entropy(scale * t @ all_i.T, labels))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--features", type=int, default=768)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--lr", type=float, default=5e-4)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Clip(args.vocab, args.features, args.width, args.dim), bucket_cap_mb=args.bucket_cap_mb)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    rest = [p for n, p in model.named_parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=args.lr)
    torch.manual_seed(1 + rank)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        lengths = torch.randint(4, args.seq + 1, (args.batch, 1))
        tokens = torch.randint(1, args.vocab, (args.batch, args.seq)) * (torch.arange(args.seq) < lengths)
        images = torch.randn(args.batch, args.features)
        loss = model(tokens, images)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        tail = sorted(times[5:])
        print(f"clip_contrastive: {args.steps} steps, {n / 1e6:.2f} M params, loss {loss.item():.3f}, "
              f"median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
