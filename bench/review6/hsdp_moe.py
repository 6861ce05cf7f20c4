"""A fresh HSDP user script for reviewing dagprof (review6): a small mixture-of-experts model on a 2-D mesh.

Habits it exercises, as users write them from the FSDP2 docs (not dagprof's own scripts, nor the conv/transformer ones):
- HSDP on 4 ranks: ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))``;
- MoE layers of gated-MLP (SwiGLU) experts with a top-2 softmax router and a load-balancing loss, computed densely
  per expert over the tokens routed to it (no expert parallelism: every rank holds every expert's shard);
- one unit per layer's experts together (``fully_shard(list(layer.experts), reshard_after_forward=2)``: a list of
  modules, FSDP2's group form, and the int form of resharding, the shard group's size), the shared gated MLP of each
  layer with ``reshard_after_forward=False``, the root left default;
- the routers passed as ``ignored_params`` (kept whole on every rank, outside FSDP) and their gradients averaged by the
  user's own ``dist.all_reduce`` over the world; a frozen token embedding (``requires_grad_(False)``) in the root;
- ``RAdam(decoupled_weight_decay=True)`` (``Adafactor`` fails on DTensor shards in torch 2.13), the routers in their own
  parameter group (plain tensors beside DTensors).

    dagprof profile -o runs/moe -- torchrun --standalone --nproc-per-node 4 bench/review6/hsdp_moe.py --steps 20
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.w_gate = nn.Linear(d, hidden, bias=False)
        self.w_up = nn.Linear(d, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class MoELayer(nn.Module):
    def __init__(self, d: int, experts: int, hidden: int, top_k: int = 2) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d)
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d, hidden) for _ in range(experts))
        self.shared = SwiGLU(d, hidden)
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.norm(x).reshape(-1, x.shape[-1])
        probs = self.router(h).softmax(-1)
        weight, chosen = probs.topk(self.top_k, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        out = self.shared(h)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            out = out.index_add(0, rows, expert(h[rows]) * weight[rows, slot, None])
        load = F.one_hot(chosen[:, 0], len(self.experts)).float().mean(0)
        aux = len(self.experts) * (load * probs.mean(0)).sum()
        return x + out.view_as(x), aux


class MoEModel(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 96, layers: int = 3, experts: int = 4, hidden: int = 192) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(MoELayer(d, experts, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(tokens)
        aux = x.new_zeros(())
        for layer in self.layers:
            x, a = layer(x)
            aux = aux + a
        return self.out(self.norm(x)), aux


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--replicate", type=int, default=2, help="replicas (1: plain FSDP2 on a 1 x N mesh)")
    args = p.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (args.replicate, world // args.replicate), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(0)
    model = MoEModel()
    model.embed.requires_grad_(False)
    routers = [layer.router.weight for layer in model.layers]
    for layer in model.layers:
        fully_shard(list(layer.experts), mesh=mesh, reshard_after_forward=mesh["dp_shard"].size())
        fully_shard(layer.shared, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, ignored_params=set(routers))
    others = [q for q in model.parameters() if q.requires_grad and all(q is not r for r in routers)]
    opt = torch.optim.RAdam([{"params": others}, {"params": routers, "lr": 3e-4}], lr=1e-3, weight_decay=0.01, decoupled_weight_decay=True)
    g = torch.Generator().manual_seed(7 + dist.get_rank())
    for step in range(args.steps):
        tokens = torch.randint(0, 512, (args.batch, args.seq + 1), generator=g)
        logits, aux = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)) + 0.01 * aux
        loss.backward()
        for w in routers:  # FSDP leaves ignored parameters alone: average their gradients ourselves
            dist.all_reduce(w.grad, op=dist.ReduceOp.SUM)
            w.grad.div_(world)
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.3f} aux {aux.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
