"""A fresh 2-D FSDP1 x TP job for reviewing dagprof (issue 16, stop 60): a small GPT-style decoder on 4 ranks.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``: TP groups {0,1},{2,3}, DP groups {0,2},{1,3}.
Habits it exercises, as users of the older API write them (no other tp_fresh job uses ``FullyShardedDataParallel``):
- each block's attention (``q``, ``k``, ``v`` ``ColwiseParallel``, ``proj`` ``RowwiseParallel``: a TP rank holds half
  the heads, read from its local width) and MLP (``up`` colwise, ``down`` rowwise) tensor parallel by
  ``parallelize_module``; LayerNorms, embeddings and the head replicated;
- then FSDP1 over the ``dp`` sub-mesh: ``FullyShardedDataParallel(model, device_mesh=mesh["dp"], auto_wrap_policy=
  ModuleWrapPolicy({Block}), use_orig_params=True, device_id=torch.device("cpu"))`` (FSDP1 on CPU);
- ``AdamW``, no clipping (FSDP1's ``clip_grad_norm_`` refuses DTensor parameters of two meshes).

Per step and rank the TP collectives are, for ``--layers L`` (fp32): forward 2 L all-reduces of batch x seq x dim x 4
bytes (each rowwise layer's output), backward 4 L all-reduces of the same (the input gradients of q, k, v and ``up``,
each its own).

    dagprof profile -o runs/fsdp1_tp -- torchrun --standalone --nproc-per-node 4 bench/tp_fresh/fsdp1_tp.py
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from common import init, loop, parse
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

VOCAB, DIM, HEADS, SEQ, BATCH = 256, 64, 4, 16, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.q, self.k, self.v, self.proj = (nn.Linear(DIM, DIM) for _ in range(4))
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.ln1(x)
        q, k, v = (f(h).view(b, s, -1, DIM // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v))  # the local heads
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + self.proj(a)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, DIM), nn.Parameter(torch.zeros(SEQ, DIM))
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def main() -> None:
    args = parse(__doc__, layers=(int, 2))
    rank = init()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Decoder(args.layers)
    for b in model.blocks:
        parallelize_module(b, mesh["tp"], {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
                                            "proj": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()})
    model = FSDP(model, device_mesh=mesh["dp"], auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True,
                 device_id=torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(100 + mesh["dp"].get_local_rank())  # both TP ranks of a replica read one batch

    def step() -> None:
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"loss {loss.item():.4f}", flush=True)

    loop(args, step)


if __name__ == "__main__":
    main()
