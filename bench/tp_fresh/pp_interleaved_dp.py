"""A fresh pipeline x data-parallel job (stop 63): a PatchTST-style forecaster on an interleaved 1F1B schedule, 4 ranks.

Habits it exercises, as users write them (no other fresh script has them):
- ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))``; the model cut into FOUR stages, two a rank
  (looped: pipeline rank r holds stages r and r + 2), driven by ``ScheduleInterleaved1F1B`` over ``--micro`` micro-batches;
- the family: a multivariate series cut into patches, each patch embedded (channel-independent), pre-norm transformer
  blocks over the patches, a flattening forecast head, MSE on the next ``HORIZON`` values;
- data parallelism by hand, no DDP or FSDP: after the schedule's step each rank flattens both its stages' gradients into
  one buffer (``torch._utils._flatten_dense_tensors``), all-reduces it over its ``dp`` group and divides;
- gradient clipping across the pipeline by hand: each rank's squared norm all-reduced over its ``pp`` group, then every
  gradient scaled; ``Adam`` over both local stages, a ``LinearLR`` warm-up.
Without a profiler it prints its median step from step 3 on.

    dagprof profile -o runs/ppi -- torchrun --standalone --nproc-per-node 4 bench/tp_fresh/pp_interleaved_dp.py
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

CHANNELS, LOOKBACK, PATCH, HORIZON, STAGES = 7, 96, 12, 24, 4


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class PatchEmbed(nn.Module):
    """(batch, lookback, channels) -> (batch * channels, patches, dim): each channel its own sequence of patches."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(PATCH, dim)
        self.pos = nn.Parameter(torch.randn(LOOKBACK // PATCH, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        patches = x.transpose(1, 2).reshape(b * CHANNELS, LOOKBACK // PATCH, PATCH)
        return self.proj(patches) + self.pos


class Head(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim * (LOOKBACK // PATCH), HORIZON)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.out(self.norm(x).flatten(1))
        return y.reshape(-1, CHANNELS, HORIZON).transpose(1, 2)


def stage_module(index: int, dim: int) -> nn.Sequential:
    """Stage ``index`` of the whole model, every stage built from one seed so the dp replicas start alike."""
    torch.manual_seed(index)
    parts: list[nn.Module] = [PatchEmbed(dim)] if index == 0 else []
    parts.append(Block(dim))
    if index == STAGES - 1:
        parts.append(Head(dim))
    return nn.Sequential(*parts)


def series(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.arange(LOOKBACK + HORIZON, dtype=torch.float32)
    phase = torch.rand(n, 1, CHANNELS, generator=g) * 6.28
    period = 8 + torch.rand(n, 1, CHANNELS, generator=g) * 40
    x = torch.sin(t[None, :, None] / period * 6.28 + phase) + 0.1 * torch.randn(n, len(t), CHANNELS, generator=g)
    return x[:, :LOOKBACK], x[:, LOOKBACK:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))
    dp, pp = mesh["dp"].get_group(), mesh["pp"].get_group()
    pp_rank, pp_size = mesh["pp"].get_local_rank(), mesh["pp"].size()
    mine = [pp_rank + k * pp_size for k in range(STAGES // pp_size)]
    modules = [stage_module(i, args.dim) for i in mine]
    stages = [PipelineStage(m, i, STAGES, torch.device("cpu"), group=pp) for m, i in zip(modules, mine)]
    schedule = ScheduleInterleaved1F1B(stages, n_microbatches=args.micro, loss_fn=F.mse_loss)
    params = [q for m in modules for q in m.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.2, total_iters=4)
    g = torch.Generator().manual_seed(7 + mesh["dp"].get_local_rank())
    first, last = 0 in mine, STAGES - 1 in mine
    times: list[float] = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = series(g, args.batch)
        opt.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        if first and last:
            schedule.step(x, target=y, losses=losses)
        elif first:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        grads = [q.grad for q in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=dp)
        flat /= dist.get_world_size(dp)
        for gr, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            gr.copy_(synced)
        sq = torch.stack([gr.pow(2).sum() for gr in grads]).sum()
        dist.all_reduce(sq, group=pp)
        scale = (1.0 / (sq.sqrt() + 1e-6)).clamp(max=1.0)
        for gr in grads:
            gr.mul_(scale)
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
        if last and mesh["dp"].get_local_rank() == 0 and step % 3 == 0:
            print(f"step {step} loss {torch.stack(losses).mean().item():.4f}", flush=True)
    if dist.get_rank() == 0 and len(times) > 3:
        print(f"median step {1000 * statistics.median(times[3:]):.1f} ms over {len(times) - 3} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
