"""A fresh tensor-parallel (optionally x data-parallel) job for reviewing dagprof's mesh labels (issue 16).

A small token model: Embedding -> 2 blocks (LayerNorm, Linear 4x up, GELU, Linear down) -> LayerNorm -> head, split
by DTensor over the mesh's ``tp`` dimension with sequence parallelism: the norms are ``SequenceParallel`` (activations
sharded on the sequence dimension), the up projections ``ColwiseParallel(input_layouts=Shard(1))`` (an all-gather in
forward, a reduce-scatter in backward), the down projections ``RowwiseParallel(output_layouts=Shard(1))`` (a
reduce-scatter in forward, an all-gather in backward). The norms' replicated weights get partial gradients that
DTensor all-reduces over ``tp`` in backward. With a ``dp`` dimension, DDP over the DP sub-mesh all-reduces gradients.

``--mesh`` names the dimensions outer to inner, as ``init_device_mesh`` takes them:
- ``tp:2``: tensor parallel only on 2 ranks;
- ``dp:2,tp:2``: TP inner (TP groups {0,1},{2,3});
- ``tp:2,dp:2``: TP outer (TP groups {0,2},{1,3}, DP groups {0,1},{2,3}).

``--optim adamw`` (default) or ``sgd``: each optimizer op on a partial DTensor gradient all-reduces it again.

    dagprof profile -o runs/tp -- torchrun --standalone --nproc-per-node 2 bench/tp_fresh/mesh_tp.py --mesh tp:2
    torchrun --standalone --nproc-per-node 4 bench/tp_fresh/mesh_tp.py --mesh tp:2,dp:2 --trace traces/tp_outer
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from common import init, loop, parse
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, WIDTH, SEQ, BATCH = 256, 64, 16, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        x = self.embed(tok)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def main() -> None:
    args = parse(__doc__, mesh=(str, "tp:2"), optim=(str, "adamw"))
    rank = init()
    dims = [d.split(":") for d in args.mesh.split(",")]
    mesh = init_device_mesh("cpu", tuple(int(n) for _, n in dims), mesh_dim_names=tuple(name for name, _ in dims))
    torch.manual_seed(0)
    model = TokenModel()
    plan = {"embed": RowwiseParallel(input_layouts=torch.distributed.tensor.Replicate(), output_layouts=Shard(1))}
    for i in range(2):
        plan |= {f"blocks.{i}.norm": SequenceParallel(), f"blocks.{i}.up": ColwiseParallel(input_layouts=Shard(1)),
                 f"blocks.{i}.down": RowwiseParallel(output_layouts=Shard(1))}
    plan["head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=torch.distributed.tensor.Replicate())
    parallelize_module(model, mesh["tp"], plan)
    dp = "dp" in mesh.mesh_dim_names
    wrapped = DDP(model, device_mesh=mesh["dp"]) if dp else model
    opt = (torch.optim.AdamW if args.optim == "adamw" else torch.optim.SGD)(wrapped.parameters(), lr=1e-3)
    torch.manual_seed(1 + (mesh["dp"].get_local_rank() if dp else 0))  # each DP replica its own batch; a TP group the same
    tok = torch.randint(0, VOCAB, (BATCH, SEQ + 1))  # the model sees SEQ tokens: even shards
    del rank

    def step() -> None:
        opt.zero_grad()
        logits = wrapped(tok[:, :-1])
        F.cross_entropy(logits.reshape(-1, VOCAB), tok[:, 1:].reshape(-1)).backward()
        opt.step()

    loop(args, step)


if __name__ == "__main__":
    main()
