"""A fresh 2-D FSDP x TP job as torchtitan writes it, for reviewing dagprof's mesh labels (issue 16), 4 ranks.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``: TP groups {0,1},{2,3}, DP groups {0,2},{1,3}.
A small decoder: Embedding -> ``--layers`` blocks (default 2) (RMSNorm, attention-free MLP: w1/w3 gated, w2 down) -> RMSNorm -> output,
tensor parallel by ``parallelize_module`` with sequence parallelism (norms ``SequenceParallel``, w1/w3
``ColwiseParallel``, w2 ``RowwiseParallel(output_layouts=Shard(1))``), the output projection column-parallel with a
sharded vocabulary (``output_layouts=Shard(-1), use_local_output=False``) and the loss computed under
``loss_parallel()``. Then FSDP2 over the DP sub-mesh: ``fully_shard(block, mesh=mesh["dp"])`` per block and the root.
Each step the script also all-reduces the detached loss over the TP group for its log line, as users do.

    dagprof profile -o runs/fsdp_tp -- torchrun --standalone --nproc-per-node 4 bench/tp_fresh/fsdp_tp.py
    torchrun --standalone --nproc-per-node 4 bench/tp_fresh/fsdp_tp.py --trace traces/fsdp_tp
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from common import init, loop, parse
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, loss_parallel, parallelize_module

VOCAB, DIM, HIDDEN, SEQ, BATCH = 512, 64, 192, 32, 4


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.feed_forward(self.ffn_norm(x))


class Decoder(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tok)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def main() -> None:
    args = parse(__doc__, layers=(int, 2))
    init()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Decoder(args.layers)
    parallelize_module(model, mesh["tp"], {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    for layer in model.layers:
        parallelize_module(layer, mesh["tp"], {
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    torch.manual_seed(1 + mesh["dp"].get_local_rank())  # each DP replica its own batch; a TP group the same
    tok = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    tp_group = mesh["tp"].get_group()
    losses = []

    def step() -> None:
        opt.zero_grad()
        pred = model(tok[:, :-1])
        with loss_parallel():
            loss = F.cross_entropy(pred.flatten(0, 1), tok[:, 1:].flatten(0, 1))
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        logged = loss.detach().full_tensor().clone() if hasattr(loss, "full_tensor") else loss.detach().clone()
        dist.all_reduce(logged, group=tp_group)  # the user's own log line: mean loss over the TP group
        losses.append(logged.item() / tp_group.size())

    loop(args, step)


if __name__ == "__main__":
    main()
