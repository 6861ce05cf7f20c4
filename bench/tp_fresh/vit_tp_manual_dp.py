"""A fresh 2-D DP x TP job for reviewing dagprof (stop 60): a ViT whose data parallelism the user wrote by hand, 4 ranks.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``: TP groups {0,1},{2,3}, DP groups {0,2},{1,3}.
Habits it exercises, as users write them (no other tp_fresh job has them: each uses DDP or FSDP2 for DP):
- a vision transformer (``Conv2d`` patch embedding, class token, learned positions, pre-norm blocks, GELU MLPs) whose
  attention q/k/v are ``ColwiseParallel`` and o ``RowwiseParallel``, MLP fc1 colwise and fc2 rowwise, by
  ``parallelize_module`` on each block with a plan of relative names; stem, norms and head replicated over TP;
- no DDP and no FSDP: after ``loss.backward()`` the user's ``average_gradients`` all-reduces every parameter's local
  gradient (``DTensor.to_local()`` for the TP-split ones) over the DP group with ``async_op=True``, waits on all the
  handles, and divides by the DP size: one all-reduce per parameter, none overlapping backward;
- ``torch.optim.Adam``, gradient clipping by value (``clip_grad_value_(..., foreach=False)``, no collective), the same batch within a TP group;
- profiled by the Python API (``--dagprof DIR``: ``dagprof.profile(DIR, steps=..., model=model)``, ``prof.step()``): the
  zero-code command sees no DDP or FSDP model here, and says so.

    torchrun --standalone --nproc-per-node 4 bench/tp_fresh/vit_tp_manual_dp.py --steps 10 --dagprof runs/vit-tp
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

IMAGE, PATCH, DIM, HEADS, CLASSES = 32, 4, 128, 4, 10


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        split = lambda t: t.view(b, n, -1, DIM // HEADS).transpose(1, 2)  # noqa: E731  (local heads under TP)
        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.o(y.transpose(1, 2).reshape(b, n, -1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n1, self.attn = nn.LayerNorm(DIM), Attention()
        self.n2, self.fc1, self.fc2 = nn.LayerNorm(DIM), nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        return x + self.fc2(F.gelu(self.fc1(self.n2(x))))


class ViT(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, DIM, PATCH, stride=PATCH)
        self.cls = nn.Parameter(torch.zeros(1, 1, DIM))
        self.pos = nn.Parameter(torch.randn(1, (IMAGE // PATCH) ** 2 + 1, DIM) * 0.02)
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, CLASSES)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.patch(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def average_gradients(model: nn.Module, group: dist.ProcessGroup) -> None:
    size = dist.get_world_size(group)
    grads = [q.grad.to_local() if isinstance(q.grad, DTensor) else q.grad for q in model.parameters() if q.grad is not None]
    for handle in [dist.all_reduce(g, group=group, async_op=True) for g in grads]:
        handle.wait()
    for g in grads:
        g.div_(size)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--dagprof", metavar="DIR", help="profile steps 4 to the second last with dagprof.profile(DIR)")
    args = p.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = ViT(args.depth)
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(), "attn.o": RowwiseParallel(),
            "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], plan)
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(mesh.get_coordinate()[0])
    dp_group = mesh["dp"].get_group()
    prof = contextlib.nullcontext()
    if args.dagprof:
        import dagprof
        prof = dagprof.profile(args.dagprof, steps=range(4, args.steps - 1), model=model)
    with prof:
        for step in range(args.steps):
            img, label = torch.randn(args.batch, 3, IMAGE, IMAGE, generator=g), torch.randint(0, CLASSES, (args.batch,), generator=g)
            loss = F.cross_entropy(model(img), label)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            average_gradients(model, dp_group)
            torch.nn.utils.clip_grad_value_(model.parameters(), 1.0, foreach=False)  # foreach refuses DTensor and Tensor mixed
            opt.step()
            if args.dagprof:
                prof.step()
            if dist.get_rank() == 0 and step % 3 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
