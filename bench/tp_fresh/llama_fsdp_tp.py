"""A fresh 2-D FSDP2 x TP job for reviewing dagprof (issue 16, stop 59): a small Llama-style decoder on 4 ranks.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``: TP groups {0,1},{2,3}, DP groups {0,2},{1,3}.
Habits it exercises, as users write them (no other tp_fresh job has this family: RMSNorm, rotary positions, SwiGLU):
- torchtitan's plan without sequence parallelism: the token embedding ``RowwiseParallel(input_layouts=Replicate())`` (an
  all-reduce of its output), attention q/k/v ``ColwiseParallel`` and o ``RowwiseParallel``, SwiGLU's w1/w3 colwise and
  w2 rowwise, the output head ``ColwiseParallel(output_layouts=Replicate())`` (an all-gather of the logits); norms
  replicated;
- FSDP2 over the ``dp`` sub-mesh per block and the root (``fully_shard(block, mesh=mesh["dp"])``);
- ``AdamW`` with a linear warm-up then cosine ``LambdaLR``; the loss averaged over the DP replicas by a blocking
  ``dist.all_reduce`` on the dp group for logging every step.

Per step and rank the TP collectives are, for ``--layers L`` (fp32): forward 1 + 2 L all-reduces of
batch x seq x dim x 4 bytes and 1 all-gather of the logits (gathered batch x seq x vocab x 4 bytes); backward
1 + 5 L all-reduces of batch x seq x dim x 4 bytes (each colwise layer's input gradient: head, q, k, v, w1, w3).

    dagprof profile -o runs/llama_tp -- torchrun --standalone --nproc-per-node 4 bench/tp_fresh/llama_fsdp_tp.py
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

VOCAB, DIM, HEADS, HIDDEN, SEQ, BATCH = 512, 128, 4, 352, 32, 8


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding on (batch, heads, seq, head_dim)."""
    half = x.shape[-1] // 2
    freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    angle = torch.arange(x.shape[-2], dtype=torch.float32)[:, None] * freq[None, :]
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        heads = q.shape[-1] // (DIM // HEADS)  # the local heads under TP
        q, k, v = (t.view(b, s, heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn_norm, self.ffn_norm = RMSNorm(DIM), RMSNorm(DIM)
        self.attn, self.ffn = Attention(), SwiGLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.norm, self.output = RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        for block in self.layers:
            x = block(x)
        return self.output(self.norm(x))


def parallelize(model: Llama, mesh) -> None:
    tp, dp = mesh["tp"], mesh["dp"]
    parallelize_module(model, tp, {"tok": RowwiseParallel(input_layouts=Replicate()),
                                   "output": ColwiseParallel(output_layouts=Replicate())})
    for block in model.layers:
        parallelize_module(block, tp, {"attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
                                       "attn.wo": RowwiseParallel(), "ffn.w1": ColwiseParallel(), "ffn.w3": ColwiseParallel(),
                                       "ffn.w2": RowwiseParallel()})
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)


def main() -> None:
    p = argparse.ArgumentParser(description="a Llama-style decoder, FSDP2 x TP on a 2 x 2 mesh")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Llama(args.layers)
    parallelize(model, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warm, total = args.warmup, args.steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(total - warm, 1))))
    g = torch.Generator().manual_seed(100 + mesh["dp"].get_local_rank())  # the same batch within a TP pair
    dp_group = mesh["dp"].get_group()
    for step in range(args.steps):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        logged = loss.detach().clone()
        dist.all_reduce(logged, group=dp_group)
        if dist.get_rank() == 0 and step % 3 == 0:
            print(f"step {step} loss {logged.item() / dist.get_world_size(dp_group):.3f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
