"""A fresh FSDP2 user script for reviewing dagprof: a message-passing graph network, checkpoint-wrapped layers, evaluation inside the loop.

Habits it exercises, as users write them (none of the other fresh FSDP scripts has them):
- ``apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper, check_fn=...)`` before
  ``fully_shard``: each layer becomes a ``CheckpointWrapper`` (its modules' paths gain ``_checkpoint_wrapped_module``),
  and ``fully_shard`` is applied to the wrappers, then the root;
- message passing by scatter: ``index_add_`` of per-edge messages into their destination nodes, a residual MLP update;
- an evaluation pass every ``--eval-every`` steps, inside the training loop (``model.eval()``, ``torch.no_grad()``:
  FSDP2 all-gathers for it and reduce-scatters nothing), then ``model.train()``;
- AdamW with weight decay off for norms and biases, ``SequentialLR`` (linear warm-up then cosine).

    dagprof profile -o runs/gnn --steps 4:10 -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/gnn_ckpt_eval.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing, checkpoint_wrapper
from torch.distributed.fsdp import fully_shard


class MessagePassing(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.msg = nn.Linear(2 * d, d)
        self.norm = nn.LayerNorm(d)
        self.update = nn.Sequential(nn.Linear(2 * d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))

    def forward(self, h: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        src, dst = edges
        m = F.silu(self.msg(torch.cat([h[src], h[dst]], dim=1)))
        agg = torch.zeros_like(h).index_add_(0, dst, m)
        return h + self.update(torch.cat([self.norm(h), agg], dim=1))


class GNN(nn.Module):
    def __init__(self, features: int = 32, d: int = 192, depth: int = 4, classes: int = 8, stem: bool = False) -> None:
        super().__init__()
        self.encode = nn.Sequential(nn.Linear(features, d), nn.SiLU(), nn.Linear(d, d)) if stem else nn.Linear(features, d)
        self.layers = nn.ModuleList(MessagePassing(d) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, classes))

    def forward(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        h = self.encode(x)
        for layer in self.layers:
            h = layer(h, edges)
        return self.head(h)


def graph(nodes: int, degree: int, gen: torch.Generator):
    x = torch.randn(nodes, 32, generator=gen)
    edges = torch.randint(0, nodes, (2, nodes * degree), generator=gen)
    return x, edges, torch.randint(0, 8, (nodes,), generator=gen)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=3)
    ap.add_argument("--checkpoint-first", action="store_true", help="the encoder a stem of two linear layers, checkpoint-wrapped "
                    "too: the model's first module, whose recomputation at the backward's end begins with the model's first layer")
    ap.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = GNN(stem=args.checkpoint_first)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                   check_fn=lambda m: isinstance(m, MessagePassing) or (args.checkpoint_first and m is model.encode))
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}], lr=1e-3)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    gen = torch.Generator().manual_seed(dist.get_rank())
    val = graph(args.nodes, args.degree, torch.Generator().manual_seed(100 + dist.get_rank()))
    times, accs = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        with peaks.step():
            x, edges, y = graph(args.nodes, args.degree, gen)
            loss = F.cross_entropy(model(x, edges), y)
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        if (step + 1) % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                accs.append((model(val[0], val[1]).argmax(1) == val[2]).float().mean().item())
            model.train()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print(f"gnn_ckpt_eval: {args.steps} steps, loss {loss.item():.3f}, val acc {accs[-1] if accs else float('nan'):.3f}, "
              f"median step {statistics.median(times[min(5, len(times) // 2):]) * 1e3:.1f} ms")
    peaks.save(dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
