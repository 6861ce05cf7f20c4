"""A fresh DDP user script for reviewing dagprof: comm hooks the user holds in an object or binds with functools.partial,
whose second collectives run from their futures' callbacks.

Habits it exercises, as users write them:
- ``--hook class``: ``ClippedTopK``, a class with state of its own (error feedback per bucket) whose bound method
  ``hook`` is registered (DDP names a hook by its ``__name__``: an instance with ``__call__`` alone is refused): it
  all-reduces the bucket's norm (``async_op=True``), and a bound method chained on that future (through
  ``functools.partial``) clips by the ranks' mean norm, keeps the top 1 % and all-gathers values and indices;
- ``--hook partial``: ``functools.partial(int8_hook, clip=...)`` (``update_wrapper`` gives it the ``__name__`` DDP
  asks for), a module-level function that all-reduces the bucket's
  largest magnitude (MAX), and a module-level callback bound with ``functools.partial`` all-reduces the int8-quantised
  gradient summed as int32;
- a bag-of-words text classifier (``EmbeddingBag``, 1.3 MB of gradients: one DDP bucket; with several in flight gloo
  can pair the callbacks' messages wrongly), Adam.

    dagprof profile -o runs/held --no-kineto -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/held_hooks.py --hook class
"""
from __future__ import annotations

import argparse
import functools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class ClippedTopK:
    """Top-k sparsification with error feedback, clipped by the ranks' mean gradient norm first."""

    def __init__(self, ratio: float, clip: float) -> None:
        self.ratio, self.clip = ratio, clip
        self.residual: dict[int, torch.Tensor] = {}

    def hook(self, state, bucket):
        grad = bucket.buffer()
        acc = grad + self.residual.get(bucket.index(), 0)
        norm = acc.norm().reshape(1)
        fut = dist.all_reduce(norm, async_op=True).get_future()
        return fut.then(functools.partial(self._sparsify, bucket.index(), grad, acc))

    def _sparsify(self, index: int, grad: torch.Tensor, acc: torch.Tensor, fut) -> torch.Tensor:
        world = dist.get_world_size()
        mean_norm = fut.value()[0].item() / world
        acc = acc * min(1.0, self.clip / (mean_norm + 1e-12))
        k = max(1, int(self.ratio * acc.numel()))
        _, idx = acc.abs().topk(k, sorted=False)
        vals = acc[idx]
        self.residual[index] = acc.index_fill(0, idx, 0.0)
        all_vals, all_idx = [torch.empty_like(vals) for _ in range(world)], [torch.empty_like(idx) for _ in range(world)]
        dist.all_gather(all_vals, vals, async_op=True).wait()
        dist.all_gather(all_idx, idx, async_op=True).wait()
        grad.zero_()
        for v, i in zip(all_vals, all_idx):
            grad.index_add_(0, i, v)
        return grad.div_(world)


def int8_hook(state, bucket, clip: float):
    grad = bucket.buffer().clamp_(-clip, clip)
    scale = grad.abs().max().reshape(1)
    fut = dist.all_reduce(scale, op=dist.ReduceOp.MAX, async_op=True).get_future()
    return fut.then(functools.partial(_int8_sum, grad))


def _int8_sum(grad: torch.Tensor, fut) -> torch.Tensor:
    scale = fut.value()[0] / 127 + 1e-12
    q = (grad / scale).round_().to(torch.int8).to(torch.int32)
    dist.all_reduce(q)
    return grad.copy_(q.float() * scale / dist.get_world_size())


def batches(steps: int, batch: int, rank: int):
    """Bags of token ids (a bag-of-words text classifier's input) and their labels, different on each rank."""
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        yield torch.randint(0, 5000, (batch, 24), generator=g), torch.randint(0, 4, (batch,), generator=g)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hook", choices=("class", "partial"), default="class")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.EmbeddingBag(5000, 64), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4)))
    if args.hook == "class":
        topk = ClippedTopK(ratio=0.01, clip=5.0)
        model.register_comm_hook(None, topk.hook)
    else:
        model.register_comm_hook(None, functools.update_wrapper(functools.partial(int8_hook, clip=1.0), int8_hook))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for tokens, labels in batches(args.steps, 32, dist.get_rank()):
        loss = F.cross_entropy(model(tokens), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if dist.get_rank() == 0:
        print(f"held_hooks ({args.hook}): {args.steps} steps, loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
