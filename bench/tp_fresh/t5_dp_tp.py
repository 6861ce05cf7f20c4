"""A fresh 2-D DP x TP job for reviewing dagprof (issue 16): a small T5-style encoder-decoder on 4 ranks.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``: TP groups {0,1},{2,3}, DP groups {0,2},{1,3}.
Habits it exercises, as users write them (not the attention-free fsdp_tp.py nor mesh_tp.py):
- multi-head self-attention and cross-attention split by heads: q/k/v ``ColwiseParallel``, o ``RowwiseParallel``
  (an all-reduce of the output in forward), the FFN w_in colwise / w_out rowwise; no sequence parallelism, so
  the norms are replicated and their gradients are whole on every TP rank;
- ``parallelize_module`` with a plan keyed by wildcard module paths (``"enc.*.attn.q"``), the per-head reshape
  reading the local head count from the local tensor's width;
- data parallel over the ``dp`` sub-mesh by FSDP2 (``fully_shard(layer, mesh=mesh["dp"], reshard_after_forward=False)``,
  ZeRO-2 style), the shared embedding in the root;
- teacher forcing, ``AdamW``, gradient clipping by hand (``get_total_norm`` per mesh, ``full_tensor``, ``clip_grads_with_norm_``):
  ``clip_grad_norm_`` refuses the DTensor gradients of the two meshes.

    dagprof profile -o runs/t5 -- torchrun --standalone --nproc-per-node 4 bench/tp_fresh/t5_dp_tp.py --steps 8
    torchrun --standalone --nproc-per-node 4 bench/tp_fresh/t5_dp_tp.py --memory /tmp/t5-mem   # each step's peak per rank
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

VOCAB, DIM, HEADS, FF, SRC, TGT, BATCH = 384, 64, 4, 192, 16, 12, 4


class Attention(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor, mem: torch.Tensor | None = None) -> torch.Tensor:
        kv = x if mem is None else mem
        q, k, v = self.q(x), self.k(kv), self.v(kv)
        heads = q.shape[-1] // (DIM // HEADS)          # local heads under TP
        split = lambda t: t.view(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)  # noqa: E731
        y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=self.causal and mem is None)
        return self.o(y.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class FFN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w_in, self.w_out = nn.Linear(DIM, FF, bias=False), nn.Linear(FF, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_out(F.relu(self.w_in(x)))


class EncLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn, self.ffn = Attention(False), FFN()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        return x + self.ffn(self.n2(x))


class DecLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n1, self.n2, self.n3 = nn.LayerNorm(DIM), nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn, self.cross, self.ffn = Attention(True), Attention(False), FFN()

    def forward(self, x: torch.Tensor, mem: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        x = x + self.cross(self.n2(x), mem)
        return x + self.ffn(self.n3(x))


class T5ish(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.enc = nn.ModuleList(EncLayer() for _ in range(layers))
        self.dec = nn.ModuleList(DecLayer() for _ in range(layers))
        self.norm = nn.LayerNorm(DIM)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        mem = self.embed(src)
        for layer in self.enc:
            mem = layer(mem)
        x = self.embed(tgt)
        for layer in self.dec:
            x = layer(x, mem)
        return F.linear(self.norm(x), self.embed.weight)     # tied output projection


def clip_by_mesh(params: list[nn.Parameter], max_norm: float) -> None:
    """``clip_grad_norm_`` refuses DTensors of two meshes (the norms' 2-D weights, the TP-split 1-D ones): one norm per mesh."""
    by_mesh: dict = {}
    for p in params:
        if p.grad is not None:
            by_mesh.setdefault(p.grad.device_mesh, []).append(p)
    total = torch.stack([torch.nn.utils.get_total_norm([p.grad for p in ps]).full_tensor() for ps in by_mesh.values()]).norm()
    for ps in by_mesh.values():
        torch.nn.utils.clip_grads_with_norm_(ps, max_norm, total)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = T5ish(args.layers)
    plan = {}
    for side, attns in (("enc", ("attn",)), ("dec", ("attn", "cross"))):
        for a in attns:
            plan.update({f"{side}.*.{a}.{n}": ColwiseParallel() for n in "qkv"})
            plan[f"{side}.*.{a}.o"] = RowwiseParallel()
        plan[f"{side}.*.ffn.w_in"] = ColwiseParallel()
        plan[f"{side}.*.ffn.w_out"] = RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    for layer in [*model.enc, *model.dec]:
        fully_shard(layer, mesh=mesh["dp"], reshard_after_forward=False)
    fully_shard(model, mesh=mesh["dp"], reshard_after_forward=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(mesh.get_coordinate()[0])   # the same batch within a TP group
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    for step in range(args.steps):
        with peaks.step():
            loss = train_step(model, opt, g)
        if dist.get_rank() == 0 and step % 3 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    peaks.save(dist.get_rank())
    dist.destroy_process_group()


def train_step(model: nn.Module, opt: torch.optim.Optimizer, g: torch.Generator) -> torch.Tensor:
    src = torch.randint(0, VOCAB, (BATCH, SRC), generator=g)
    tgt = torch.randint(0, VOCAB, (BATCH, TGT + 1), generator=g)
    logits = model(src, tgt[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt[:, 1:].reshape(-1))
    loss.backward()
    clip_by_mesh(list(model.parameters()), 1.0)
    opt.step()
    opt.zero_grad()
    return loss.detach()


if __name__ == "__main__":
    main()
