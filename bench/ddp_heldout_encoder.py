"""A held-out DDP job, written as a user would: a small transformer-encoder text classifier (linear-heavy gradients).

Token and learned position embeddings, a pre-norm ``nn.TransformerEncoder`` (fused QKV in-projections, 4x feed-forward
linears, GELU), a [CLS] token read by a two-layer head, trained with AdamW (weight decay kept off biases and norms, the
usual two parameter groups), label smoothing, gradient clipping and a warm-up then cosine learning-rate schedule, plain
DDP, gloo on CPU, one thread per rank. Its 45 gradients (8.7 MB) are mostly square and 4:1 matrices (the encoder's linears), with
one vocabulary-sized embedding and many small vectors. The script knows nothing of dagprof, and no dagprof prediction
was developed on it:

    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/ddp_heldout_encoder.py --steps 16" --ranks 2 --link-model-calibrate

(with the venv's bin first on PATH: ``python`` in the command is looked up there)
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class EncoderClassifier(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int, classes: int, dropout: float = 0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, seq + 1, d))
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout, activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Dropout(dropout), nn.Linear(d, classes))
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.cls, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.cls.expand(tokens.shape[0], -1, -1), self.tok(tokens)], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's usual split: no decay on biases, norms, embeddings' positions and the [CLS] token."""
    decay, plain = [], []
    for name, p in model.named_parameters():
        (plain if p.ndim < 2 or name.endswith(("pos", "cls")) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--d", type=int, default=192)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--warmup", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(EncoderClassifier(args.vocab, args.d, args.layers, args.heads, args.seq, args.classes))
    opt = torch.optim.AdamW(param_groups(model.module, 0.01), lr=3e-4, betas=(0.9, 0.98))
    total = max(args.steps, args.warmup + 1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / args.warmup if s < args.warmup else 0.5 * (1 + math.cos(math.pi * (s - args.warmup) / (total - args.warmup))))
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        tokens = torch.randint(1, args.vocab, (args.batch, args.seq), generator=g)
        labels = tokens[:, :4].sum(1) % args.classes  # a label the tokens decide
        loss = F.cross_entropy(model(tokens), labels, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
