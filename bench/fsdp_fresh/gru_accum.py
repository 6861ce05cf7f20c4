"""A fresh FSDP2 user script for reviewing dagprof (issue 16): a small GRU language model.

Habits it exercises, as users write them (not dagprof's own fsdp_train.py):
- nested units: ``fully_shard`` on ``layers[i].ffn`` inside ``layers[i]``, then on ``layers[i]``;
- a GRU in its own unit; tied embeddings (the output projection reuses ``embed.weight``, both in the root unit);
- ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``; the root with ``reshard_after_forward=False``;
- gradient accumulation: ``set_requires_gradient_sync(False)`` on all but the last micro-batch;
- ``--checkpoint``: ``torch.utils.checkpoint`` (non-reentrant) around each layer, so backward runs forward ops again;
- ``--reshard-to N``: ``reshard_after_forward=N`` (an int) on the layers;
- ``clip_grad_norm_`` on the DTensor gradients, ``AdamW(foreach=True)``, a cosine LR schedule.

    dagprof profile -o runs/gru -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/gru_accum.py --steps 20
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint


class FFN(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.w1 = nn.Linear(d, 3 * d)
        self.w2 = nn.Linear(3 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.silu(self.w1(self.norm(x))))


class Layer(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.mix = nn.Linear(d, d)
        self.ffn = FFN(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn(x + torch.tanh(self.mix(x)))


class GRULM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, recompute: bool = False) -> None:
        super().__init__()
        self.recompute = recompute
        self.embed = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.layers = nn.ModuleList(Layer(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        x, _ = self.rnn(self.embed(tok))
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.recompute else layer(x)
        return F.linear(self.norm(x), self.embed.weight)   # tied output projection


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--width", type=int, default=192)
    p.add_argument("--wrap", choices=("nested", "pairs", "root", "ddp"), default="nested",
                   help="what the what-ifs predict, to measure them: pairs = layers.i.ffn not a unit (whatif --units merge:2), "
                        "root = fully_shard on the root only (--units merge:all), ddp = DistributedDataParallel, fp32 "
                        "(--data-parallel ddp)")
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing of each layers.i (non-reentrant)")
    p.add_argument("--reshard-to", type=int, default=0,
                   help="reshard_after_forward=N (an int: reshard to N ranks after forward) on each layers.i, not True")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = GRULM(4096, args.width, 3, recompute=args.checkpoint)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if args.wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
        model.set_requires_gradient_sync = lambda sync: setattr(model, "require_backward_grad_sync", sync)
    else:
        if args.wrap != "root":
            fully_shard(model.rnn, mp_policy=mp)
            for layer in model.layers:
                if args.wrap == "nested":
                    fully_shard(layer.ffn, mp_policy=mp)
                fully_shard(layer, mp_policy=mp, reshard_after_forward=args.reshard_to or True)
        fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, foreach=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(args.steps):
        for micro in range(args.accum):
            model.set_requires_gradient_sync(micro == args.accum - 1)
            tok = torch.randint(0, 4096, (4, 33), generator=g)
            logits = model(tok[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tok[:, 1:].reshape(-1))
            (loss / args.accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if dist.get_rank() == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
