"""A held-out FSDP1 job, written as a user would: a click-through-rate style MLP over a large embedding.

Not the model of the test recordings (``bench/fsdp1_train.py``): token ids are embedded (a 16,384 x 64
table), mean-pooled per sample, concatenated with dense features and run through a 4-layer MLP to a
binary label. FSDP1 picks its units with ``size_based_auto_wrap_policy`` (modules of at least
``--min-params`` parameters: the embedding and the wide layers), gloo on CPU. The script knows nothing of
dagprof: profile it with ``dagprof profile -o RUN -- torchrun --standalone --nproc-per-node 2
bench/fsdp1_heldout.py``. ``parse_args``/``build``/``train`` serve ``bench/bench_overhead.py``.
"""
from __future__ import annotations

import argparse
import functools
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy


class CTR(nn.Module):
    def __init__(self, vocab: int, dim: int, dense: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.bottom = nn.Linear(dense, dim)
        self.mlp = nn.Sequential(nn.Linear(2 * dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden // 2), nn.ReLU(), nn.Linear(hidden // 2, 1))

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        pooled = self.embed(ids).mean(dim=1)
        return self.mlp(torch.cat([pooled, F.relu(self.bottom(dense))], dim=1)).squeeze(1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dense", type=int, default=32)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ids", type=int, default=20, help="token ids per sample")
    p.add_argument("--min-params", type=int, default=100_000, help="size_based_auto_wrap_policy's min_num_params")
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--times", metavar="FILE", help="write rank 0's step times (s) as JSON")
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # every rank alike: sync_module_states needs a GPU
    model = FSDP(CTR(args.vocab, args.dim, args.dense, args.hidden),
                 auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=args.min_params),
                 sharding_strategy=ShardingStrategy.FULL_SHARD, backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                 device_id=torch.device("cpu"))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train(args: argparse.Namespace, model: nn.Module, opt: torch.optim.Optimizer, prof=None) -> list[float]:
    g = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        ids = torch.randint(0, args.vocab, (args.batch, args.ids), generator=g)
        dense = torch.randn(args.batch, args.dense, generator=g)
        label = (ids[:, 0] % 2).float()
        loss = F.binary_cross_entropy_with_logits(model(ids, dense), label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.step()
    return times


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    times = train(args, *build(args))
    if args.times and dist.get_rank() == 0:
        with open(args.times, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
