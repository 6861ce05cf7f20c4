"""A fresh DDP user script for reviewing dagprof: a small GPT-style language model under DDP, then ``torch.compile``.
Habits it exercises, as users write them:
- ``model = torch.compile(DDP(model))``, the order PyTorch's DDP notes give (Dynamo's DDPOptimizer splits the compiled
  graph at DDP's bucket boundaries so the all-reduces still overlap backward);
- pre-norm blocks with ``F.scaled_dot_product_attention(is_causal=True)``, tied input and output embeddings;
- ``AdamW(fused=False)`` with ``zero_grad(set_to_none=True)``, a linear warm-up (``LambdaLR``), ``clip_grad_norm_``;
- ``--no-compile`` runs the same job eager, to compare.
    dagprof profile -o runs/compiled -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/compiled_lm.py --steps 20
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, DIM, HEADS, LAYERS, SEQ = 1024, 128, 4, 3, 64


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, HEADS, DIM // HEADS).transpose(1, 2) for z in self.qkv(self.ln1(x)).chunk(3, -1))
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Parameter(torch.zeros(1, SEQ, DIM))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)

    def forward(self, idx):
        x = self.tok(idx) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x) @ self.tok.weight.T  # tied output projection


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(GPT())
    if not args.no_compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        idx = torch.randint(0, VOCAB, (args.batch, SEQ + 1), generator=g)
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
