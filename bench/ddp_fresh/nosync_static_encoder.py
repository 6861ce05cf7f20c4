"""A fresh DDP user script for reviewing dagprof: a text classifier on ``nn.TransformerEncoder``, accumulating gradients.

Habits it exercises, as users write them (none of the other fresh scripts has them together):
- ``DDP(model, static_graph=True)`` and gradient accumulation with ``model.no_sync()`` on every micro-batch but the
  last of each optimizer step (``--accum`` micro-batches, default 3; the first step takes one, as static_graph needs);
- the stock ``nn.TransformerEncoder`` (``batch_first=True``, ``norm_first=True``) with a padding mask and mean pooling
  over the tokens that are not padding; a learned [CLS]-free classifier head;
- ``SGD(momentum=0.9, nesterov=True)`` with ``StepLR``; the loss divided by ``--accum``.

    dagprof profile -o runs/nosync -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/nosync_static_encoder.py --steps 12
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, DIM, SEQ, BATCH, LABELS = 2000, 128, 48, 8, 5


class Classifier(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.pos = nn.Parameter(torch.zeros(1, SEQ, DIM))
        layer = nn.TransformerEncoderLayer(DIM, nhead=4, dim_feedforward=4 * DIM, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, LABELS)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        pad = tok == 0
        h = self.encoder(self.embed(tok) + self.pos, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))


def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tok = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=g)
    tok[torch.arange(SEQ)[None, :] >= lengths[:, None]] = 0
    return tok, tok[:, 1] % LABELS


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--accum", type=int, default=3)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(Classifier(args.layers), static_graph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    g = torch.Generator().manual_seed(7 + dist.get_rank())
    for step in range(args.steps):
        # static_graph records the graph in the first backward, which must not run under no_sync (torch 2.13 asserts
        # "expect_autograd_hooks_" in reducer.cpp otherwise): the first step takes one micro-batch.
        accum = 1 if step == 0 else args.accum
        for micro in range(accum):
            tok, label = batch(g)
            ctx = model.no_sync() if micro < accum - 1 else contextlib.nullcontext()
            with ctx:
                loss = F.cross_entropy(model(tok), label) / accum
                loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        if dist.get_rank() == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item() * accum:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
