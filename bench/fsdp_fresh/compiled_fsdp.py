"""A fresh FSDP2 user script for reviewing dagprof: a small GPT-style language model sharded with ``fully_shard``, then
compiled, in the two orders users write:
- ``--compile whole``: ``fully_shard`` on each block and the root, then ``model = torch.compile(model)`` (FSDP2's own hooks
  run eager: Dynamo skips them by default, ``torch._dynamo.config.skip_fsdp_hooks``);
- ``--compile blocks``: ``block.compile()`` (in place, no ``OptimizedModule``) on each block before ``fully_shard``, as
  torchtitan-style per-block compile does;
- ``--compile inplace``: ``fully_shard`` as for ``whole``, then ``model.compile()`` (in place: the root stays itself);
- ``--compile none``: the same job eager, to compare.
Also: pre-norm blocks with ``F.scaled_dot_product_attention(is_causal=True)``, ``AdamW(foreach=True)``, ``clip_grad_norm_``.

    dagprof profile -o runs/cfsdp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/compiled_fsdp.py --steps 12
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

VOCAB, DIM, HEADS, LAYERS, SEQ = 1024, 128, 4, 3, 64


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.ln2(x))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(SEQ, DIM))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)

    def forward(self, tok):
        x = self.embed(tok) + self.pos[: tok.shape[1]]
        for block in self.blocks:
            x = block(x)
        return F.linear(self.norm(x), self.embed.weight)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--compile", choices=("whole", "blocks", "inplace", "none"), default="whole")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = LM()
    for block in model.blocks:
        if args.compile == "blocks":
            block.compile()
        fully_shard(block)
    fully_shard(model)
    if args.compile == "whole":
        model = torch.compile(model)
    elif args.compile == "inplace":
        model.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(args.steps):
        t0 = time.perf_counter()
        tok = torch.randint(0, VOCAB, (8, SEQ + 1), generator=g)
        logits = model(tok[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tok[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.3f} {1e3 * (time.perf_counter() - t0):.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
